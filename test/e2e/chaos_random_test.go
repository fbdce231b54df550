//go:build kernel

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/meshwire/meshwire/internal/logging"
	"github.com/meshwire/meshwire/test/harness"
)

// Kills at arbitrary instructions: beside the named points (chaos_test.go),
// each command is killed by an external SIGKILL after a random delay drawn
// uniformly from (0, 1.2 x its median duration] (killDelay; the median of
// several undisturbed runs), wherever it is then, so that its end is hit
// too. Where a kill landed is told two ways: its state (the last record the
// command logged at debug level, the system call its main thread was in
// and the programs of its group) and its code point (that record and the
// function of meshwire's code each of its threads stood in,
// killsite_test.go). The same code point shows as several states (a
// thread in futex, in read or running), so the report gives both counts,
// and each command must reach a floor of distinct code points
// (chaosPointFloor).
//
// MESHWIRE_CHAOS_KILLS sets the kills per command (default chaosRandomKills,
// a sample for `make test`); `make chaos` runs the full count.

// chaosRandomKills is the sample `make test` runs per plugin command.
const chaosRandomKills = 4

func chaosRandomCount() int {
	if n, err := strconv.Atoi(os.Getenv("MESHWIRE_CHAOS_KILLS")); err == nil && n > 0 {
		return n
	}
	return chaosRandomKills
}

// killTally counts the kills of one test, the distinct states they
// reached and the distinct code points, per command.
type killTally struct {
	mu     sync.Mutex
	kills  map[string]int
	states map[string]map[string]bool
	points map[string]map[string]int // hits per code point
}

// kill is where one kill landed.
type kill struct {
	state string // the last record; the main thread's system call and the group's programs
	point string // the last record; the functions of meshwire's code the threads stood in
}

func (k *killTally) add(cmd string, at kill) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.kills == nil {
		k.kills, k.states, k.points = map[string]int{}, map[string]map[string]bool{}, map[string]map[string]int{}
	}
	k.kills[cmd]++
	if k.states[cmd] == nil {
		k.states[cmd], k.points[cmd] = map[string]bool{}, map[string]int{}
	}
	k.states[cmd][at.state] = true
	k.points[cmd][at.point]++
}

// chaosPointFloors are the fewest distinct code points each command's
// kills must reach in `make chaos` (60 kills per command and list: kills
// is the command's total there), about half of what a run of it reached
// (2026-11-28: bridge ADD 70 of 120 kills, loopback DEL 17 of 240,
// portmap DEL 14 of 120, meshwire install 9 of 120, ...). Some commands
// spend most of their time in one place (portmap DEL in its firewall
// transaction, install copying binaries, loopback in the process's
// start), so their floors are low.
var chaosPointFloors = map[string]struct{ floor, kills int }{
	"bandwidth ADD":    {8, 60},
	"bandwidth DEL":    {6, 60},
	"bridge ADD":       {30, 120},
	"bridge DEL":       {25, 120},
	"veth ADD":         {15, 60},
	"veth DEL":         {15, 60},
	"portmap ADD":      {12, 120},
	"portmap DEL":      {6, 120},
	"loopback ADD":     {8, 240},
	"loopback DEL":     {8, 240},
	"intercept ADD":    {25, 180},
	"intercept DEL":    {15, 180},
	"iptables-init":    {12, 120},
	"meshwire install": {4, 120},
}

// chaosPointFloor is the floor of cmd for n kills: its floor in `make
// chaos`, in proportion for fewer kills (code points grow slower than
// kills, so the proportion is below what n kills reach), at least 1.
func chaosPointFloor(cmd string, n int) (int, error) {
	f, ok := chaosPointFloors[cmd]
	if !ok {
		return 0, fmt.Errorf("no floor of code points is stated for %s (chaosPointFloors)", cmd)
	}
	if n >= f.kills {
		return f.floor, nil
	}
	return max(1, (f.floor*n+f.kills-1)/f.kills), nil
}

// report logs the kills, states and code points per command, with the
// code points themselves in verbose runs, and fails a command whose kills
// reached fewer code points than the floor.
func (k *killTally) report(t *testing.T) {
	t.Helper()
	var names []string
	total := 0
	for n := range k.kills {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %d kills, %d states, %d code points", n, k.kills[n], len(k.states[n]), len(k.points[n])))
		total += k.kills[n]
		if testing.Verbose() {
			var points []string
			for _, p := range slices.Sorted(maps.Keys(k.points[n])) {
				points = append(points, fmt.Sprintf("%3d x %s", k.points[n][p], p))
			}
			t.Logf("code points of %s:\n  %s", n, strings.Join(points, "\n  "))
		}
		floor, err := chaosPointFloor(n, k.kills[n])
		if err != nil {
			t.Error(err)
		} else if len(k.points[n]) < floor {
			t.Errorf("%s: %d kills reached %d distinct code points, want at least %d: the delays miss most of the command", n, k.kills[n], len(k.points[n]), floor)
		}
	}
	t.Logf("random kills: %d: %s", total, strings.Join(parts, "; "))
}

// lastState is the last record a killed command logged ("msg" and its
// "step" when it names one), or "no record" when it was killed before
// its first.
func lastState(logFile string) string {
	f, err := os.Open(logFile)
	if err != nil {
		return "no record"
	}
	defer f.Close()
	state := "no record"
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r struct{ Msg, Step string }
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue // a line cut by the kill
		}
		state = r.Msg
		if r.Step != "" {
			state += ": " + r.Step
		}
	}
	return state
}

// killDelay draws the delay of a kill from (0, 1.2 x median]: anywhere in
// a run of median length, and past its end for the runs that take longer.
func killDelay(median time.Duration) time.Duration {
	return time.Duration(rand.Int64N(int64(median)*6/5) + 1)
}

// medianRun is the median duration of runs (the lower one of an even
// count).
func medianRun(runs []time.Duration) time.Duration {
	d := slices.Sorted(slices.Values(runs))
	return d[(len(d)-1)/2]
}

// killAfter runs cmd, killed with SIGKILL after delay unless it ends
// first: only the command, as a runtime kills a plugin (its children, a
// firewall tool, must die with it), or with group its whole process group.
// It reports whether the kill landed and where: the programs of the group
// at that instant (a firewall tool the command ran, or only itself) and
// the system call its main thread was in; and the code its threads stood
// in (codeSite).
func killAfter(cmd *exec.Cmd, delay time.Duration, group bool) (killed bool, where, code string, err error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return false, "", "", err
	}
	var mu sync.Mutex
	done := false
	timer := time.AfterFunc(delay, func() {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			// Stopped at the drawn instant, looked at, then killed: the
			// look (a walk of /proc) must not delay the kill.
			pid := cmd.Process.Pid
			if group {
				pid = -pid
			}
			_ = syscall.Kill(pid, syscall.SIGSTOP)
			waitStopped(cmd.Process.Pid)
			where = processGroupState(cmd.Process.Pid)
			code = codeSite(cmd.Process.Pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			killed = true
		}
	})
	err = cmd.Wait()
	mu.Lock()
	done = true
	k := killed
	mu.Unlock()
	timer.Stop()
	var ee *exec.ExitError
	if k && errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled() {
		return true, where, code, err
	}
	return false, "", "", err
}

// processGroupState names the programs of process group pgid but its
// leader, and the system call the leader's main thread is in ("running"
// when none).
func processGroupState(pgid int) string {
	var children []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == pgid {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces.
		i := bytes.LastIndexByte(stat, ')')
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 2 && f[2] == strconv.Itoa(pgid) {
			children = append(children, string(stat[bytes.IndexByte(stat, '(')+1:i]))
		}
	}
	slices.Sort(children)
	sc := "running"
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", pgid)); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 && f[0] != "running" {
			sc = "syscall " + f[0]
		}
	}
	if len(children) == 0 {
		return sc
	}
	return sc + ", running " + strings.Join(slices.Compact(children), "+")
}

// runOrKill runs cmd (an iptables-init, an install) with its debug log
// in a file: to its end (delay 0), or killed after delay, alone or with
// its process group at random. It returns whether the kill landed, how
// long the run took, where it was killed, and its error (with its output
// when it ran to its end).
func runOrKill(t *testing.T, cmd *exec.Cmd, delay time.Duration) (killed bool, took time.Duration, at kill, err error) {
	logFile := filepath.Join(t.TempDir(), "run.log")
	cmd.Env = append(os.Environ(), logging.EnvFile+"="+logFile, logging.EnvLevel+"=debug")
	start := time.Now()
	var where, code string
	if delay > 0 {
		killed, where, code, err = killAfter(cmd, delay, rand.IntN(2) == 0)
	} else if out, rerr := cmd.CombinedOutput(); rerr != nil {
		err = fmt.Errorf("%w: %s", rerr, out)
	}
	last := lastState(logFile)
	return killed, time.Since(start), kill{state: last + "; " + where, point: last + "; " + code}, err
}

// undisturbedMedian runs run (to its end) n times and returns the median
// duration, the base of the kills' delays.
func undisturbedMedian(t *testing.T, n int, run func() (time.Duration, error)) time.Duration {
	t.Helper()
	var took []time.Duration
	for range n {
		d, err := run()
		if err != nil {
			t.Fatalf("undisturbed run: %v", err)
		}
		took = append(took, d)
	}
	return medianRun(took)
}

// killerExec is libcni's exec with one plugin command armed: the next
// run of it is killed after a delay; every run is timed, per plugin and
// command, for the delays' bounds.
type killerExec struct {
	invoke.DefaultExec
	dir string

	mu        sync.Mutex
	durations map[string][]time.Duration
	armed     string // "plugin CMD"
	delay     time.Duration
	fired     bool // the armed command ran
	killed    bool // and the kill landed
	at        kill // where
	n         int
}

func newKillerExec(dir string) *killerExec {
	return &killerExec{DefaultExec: invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}, dir: dir, durations: map[string][]time.Duration{}}
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

func (k *killerExec) ExecPlugin(ctx context.Context, path string, stdin []byte, env []string) ([]byte, error) {
	name := filepath.Base(path) + " " + envValue(env, "CNI_COMMAND")
	k.mu.Lock()
	arm := k.armed == name && !k.fired
	delay := k.delay
	k.n++
	logFile := filepath.Join(k.dir, fmt.Sprintf("run-%d.log", k.n))
	if arm {
		k.fired = true
	}
	k.mu.Unlock()
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = append(slices.Clone(env), logging.EnvFile+"="+logFile, logging.EnvLevel+"=debug")
	cmd.Stdin = bytes.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	start := time.Now()
	var killed bool
	var where, code string
	var err error
	if arm {
		killed, where, code, err = killAfter(cmd, delay, k.n%2 == 0)
	} else {
		err = cmd.Run()
	}
	took := time.Since(start)
	defer os.Remove(logFile)
	k.mu.Lock()
	if arm {
		last := lastState(logFile)
		k.killed, k.at = killed, kill{state: last + "; " + where, point: last + "; " + code}
	} else {
		k.durations[name] = append(k.durations[name], took)
	}
	k.mu.Unlock()
	if killed {
		return nil, fmt.Errorf("signal: killed")
	}
	if err != nil {
		var e types.Error
		if json.Unmarshal(out.Bytes(), &e) == nil && e.Code != 0 {
			return nil, &e
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return out.Bytes(), nil
}

// arm makes the next run of plugin's cmd die after killDelay of its
// median duration over its undisturbed runs so far (at least the 3 cycles
// chaosRandomRun starts with).
func (k *killerExec) arm(t *testing.T, plugin, cmd string) {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	name := plugin + " " + cmd
	if len(k.durations[name]) < 3 {
		t.Fatalf("%s has run undisturbed %d times: no median to draw its kills' delays from", name, len(k.durations[name]))
	}
	k.armed, k.delay, k.fired, k.killed, k.at = name, killDelay(medianRun(k.durations[name])), false, false, kill{}
}

// outcome is whether the armed command ran and was killed, and where.
func (k *killerExec) outcome() (fired, killed bool, at kill) {
	k.mu.Lock()
	defer k.mu.Unlock()
	fired, killed, at = k.fired, k.killed, k.at
	k.armed = ""
	return fired, killed, at
}

// chaosRandomRun kills each of plugins' ADD and DEL at random instants
// until each was killed n times, every kill followed by the runtime's
// DEL, which must succeed the first time, on pods from pod. Right after
// every DEL, before anything else runs, the host must equal host (a
// snapshot taken with dirs, the pods' namespaces aside) and the pod its
// own snapshot from before its ADD. The list first runs 3 undisturbed
// ADD+DEL cycles, which time the commands.
func chaosRandomRun(t *testing.T, h *harness.H, list *libcni.NetworkConfigList, caps map[string]any, args [][2]string, plugins []string, n int, tally *killTally, pod func() *harness.NS, host *harness.Snapshot, dirs []string) {
	t.Helper()
	k := newKillerExec(t.TempDir())
	saved := h.CNI
	h.CNI = libcni.NewCNIConfigWithCacheDir(h.CNIPath, h.CacheDir, k)
	defer func() { h.CNI = saved }()
	attach := func(ns *harness.NS) *harness.Attachment {
		a := h.Attach(list, ns, "eth0", caps)
		if args != nil {
			a.RT.Args = append(slices.Clone(args), [2]string{"K8S_POD_INFRA_CONTAINER_ID", a.RT.ContainerID})
		}
		return a
	}
	var live []*harness.NS
	fresh := map[*harness.NS]*harness.Snapshot{}
	newPod := func() *harness.NS {
		ns := pod()
		live = append(live, ns)
		fresh[ns] = chaosPodSnapshot(t, ns)
		return ns
	}
	del := func(a *harness.Attachment, ns *harness.NS, why string) {
		t.Helper()
		if err := a.Del(); err != nil {
			t.Fatalf("the runtime's DEL after %s: %v", why, err)
		}
		diff, err := host.HostDiff(dirs, live...)
		if err != nil {
			t.Fatal(err)
		}
		if len(diff) > 0 {
			t.Fatalf("the host after the DEL that followed %s, against its snapshot:\n  %s", why, strings.Join(diff, "\n  "))
		}
		if diff, err = fresh[ns].NSDiff(ns); err != nil {
			t.Fatal(err)
		}
		if len(diff) > 0 {
			t.Fatalf("%s after the DEL that followed %s, against the fresh pod:\n  %s", ns.Name, why, strings.Join(diff, "\n  "))
		}
	}
	for i := 0; i < 3; i++ {
		ns := newPod()
		a := attach(ns)
		a.MustAdd()
		del(a, ns, "an undisturbed ADD")
	}
	for _, p := range plugins {
		for _, cmd := range []string{"ADD", "DEL"} {
			for got, tries := 0, 0; got < n; tries++ {
				if tries > 20*n {
					t.Fatalf("%s %s: %d kills in %d tries: the delays miss the command", p, cmd, got, tries)
				}
				ns := newPod()
				a := attach(ns)
				var err error
				if cmd == "ADD" {
					k.arm(t, p, cmd)
					_, err = a.Add()
				} else {
					a.MustAdd()
					k.arm(t, p, cmd)
					err = a.Del()
				}
				fired, killed, at := k.outcome()
				why := fmt.Sprintf("%s %s run undisturbed", p, cmd)
				switch {
				case !fired:
					t.Fatalf("%s %s never ran (%v)", p, cmd, err)
				case killed:
					got++
					tally.add(p+" "+cmd, at)
					why = fmt.Sprintf("%s %s killed at %q (%s)", p, cmd, at.point, at.state)
				case err != nil:
					t.Fatalf("%s %s failed undisturbed: %v", p, cmd, err)
				}
				del(a, ns, why)
			}
		}
	}
}

// TestChaosRandom kills every command meshwire ships at arbitrary
// instants: bridge (ipMasq) with portmap (iptables, then nftables) and
// bandwidth, veth, loopback, intercept with Istio's annotations in
// REDIRECT, TPROXY and EBPF mode with the fast path attached,
// iptables-init and `meshwire install`. After each kill the runtime's DEL
// (or the next run) leaves the host exactly as before (the whole
// snapshot: links, addresses, routes, rules, sysctls, qdiscs and filters,
// every firewall backend, pins and map entries, /var/lib/cni and
// /run/meshwire), every pod's namespace as it was before ADD, no address
// reserved; a second iptables-init or install converges on an undisturbed
// run's state.
func TestChaosRandom(t *testing.T) {
	harness.RequireRoot(t)
	n := chaosRandomCount()
	var tally killTally
	defer tally.report(t)
	t.Run("interface plugins", func(t *testing.T) {
		dataDir := t.TempDir()
		for _, tc := range []struct{ name, list string }{
			{"bridge+portmap-iptables+bandwidth", `{"type":"bridge","bridge":"mwtrand0","isGateway":true,"ipMasq":true,"hostVethPrefix":"mwrb",
				 "ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"198.18.57.0/24"}]]}},
				{"type":"portmap","backend":"iptables","capabilities":{"portMappings":true}},
				{"type":"bandwidth","capabilities":{"bandwidth":true}}`},
			{"bridge+portmap-nftables", `{"type":"bridge","bridge":"mwtrand0","isGateway":true,"ipMasq":true,"hostVethPrefix":"mwrb",
				 "ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"198.18.57.0/24"}]]}},
				{"type":"portmap","backend":"nftables","capabilities":{"portMappings":true}}`},
			{"veth+loopback", `{"type":"veth","ipMasq":true,"hostVethPrefix":"mwrv",
				 "ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"198.18.58.0/24"}]]}},
				{"type":"loopback"}`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				h := harness.New(t)
				nodeBaseline(t)
				t.Cleanup(func() { bridgeRemoveLinks("mwtrand0") })
				list := h.ConfList(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"mwt-rand","plugins":[`+tc.list+`]}`, dataDir))
				caps := map[string]any{
					"portMappings": []map[string]any{{"hostPort": 33180, "containerPort": 80, "protocol": "tcp"}},
					"bandwidth":    map[string]any{"ingressRate": 10000000, "ingressBurst": 100000, "egressRate": 10000000, "egressBurst": 100000},
				}
				// The bridge and the node's base chains outlive pods: made by
				// a first pod before the snapshot, removed after the check.
				first := h.Attach(list, h.NewNS("rand"), "eth0", caps)
				first.MustAdd()
				t.Cleanup(func() {
					if err := first.Del(); err != nil {
						t.Error(err)
					}
				})
				chaosSettled(t, "mwr", "mwtrand")
				h.CheckNoLeaks(dataDir) // judged before the first pod goes
				host, err := harness.StableSnapshot(dataDir)
				if err != nil {
					t.Fatal(err)
				}
				var plugins []string
				for _, p := range list.Plugins {
					plugins = append(plugins, p.Network.Type)
				}
				// lo up and down once: the kernel gives it its address and
				// routes the first time it comes up, which loopback's DEL
				// (lo down, as the reference's) does not take back.
				pod := func() *harness.NS {
					ns := h.NewNS("rand")
					chaosPodSetup(t, ns, [][]string{{"ip", "link", "set", "lo", "up"}, {"ip", "link", "set", "lo", "down"}})
					return ns
				}
				chaosRandomRun(t, h, list, caps, nil, plugins, n, &tally, pod, host, []string{dataDir})
			})
		}
	})
	t.Run("intercept", func(t *testing.T) {
		h := harness.New(t)
		interceptEBPFAttach(t, h) // the fast path and ebpf interception, as the node agent keeps them
		h.CheckNoLeaks()
		// The intercept entry exactly as `meshwire install --chain` writes it.
		list := loopbackIntercept(t, h, "mwt-rand-icpt")
		for _, mode := range []string{"REDIRECT", "TPROXY", "EBPF"} {
			t.Run(mode, func(t *testing.T) {
				annotations := map[string]string{"sidecar.istio.io/status": istioStatus, "sidecar.istio.io/interceptionMode": mode}
				if mode == "EBPF" {
					annotations = map[string]string{"sidecar.istio.io/status": istioStatus, "intercept.meshwire.io/mode": "EBPF"}
				}
				caps := map[string]any{"io.kubernetes.cri.pod-annotations": annotations}
				args := [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "shop"}, {"K8S_POD_NAME", "p1"}}
				// With the pods of the modes before, which live as long as h.
				host, err := harness.StableSnapshot()
				if err != nil {
					t.Fatal(err)
				}
				pod := func() *harness.NS {
					ns := h.NewNS("rand")
					chaosPodSetup(t, ns, [][]string{{"ip", "link", "add", "eth9", "type", "veth", "peer", "name", "eth8"},
						{"ip", "addr", "add", "198.18.59.2/24", "dev", "eth9"}, {"ip", "addr", "add", "fd42:6d79::2/64", "dev", "eth9", "nodad"},
						{"ip", "link", "set", "lo", "up"}, {"ip", "link", "set", "lo", "down"}})
					return ns
				}
				chaosRandomRun(t, h, list, caps, args, []string{"loopback", "intercept"}, n, &tally, pod, host, nil)
			})
		}
	})
	t.Run("iptables-init", func(t *testing.T) {
		h := harness.New(t)
		h.CheckNoLeaks()
		host, err := harness.StableSnapshot()
		if err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(h.BinDir, "iptables-init")
		args := chaosIptablesInitArgs
		var pods []*harness.NS
		newPod := func() *harness.NS {
			ns := chaosIptablesInitPod(t, h, "rand")
			pods = append(pods, ns)
			return ns
		}
		// In the pod's namespace, through nsenter (so that the kill of its
		// process group takes iptables-init and what it runs).
		run := func(ns *harness.NS, delay time.Duration, a ...string) (killed bool, took time.Duration, at kill, err error) {
			return runOrKill(t, exec.Command("nsenter", append([]string{"--net=" + ns.Path, bin}, a...)...), delay)
		}
		empty := chaosPodSnapshot(t, newPod())
		ref := newPod()
		if _, _, _, err := run(ref, 0, args...); err != nil {
			t.Fatal(err)
		}
		want := chaosPodSnapshot(t, ref)
		median := undisturbedMedian(t, 5, func() (time.Duration, error) {
			_, took, _, err := run(newPod(), 0, args...)
			return took, err
		})
		for got, tries := 0, 0; got < 2*n; tries++ {
			if tries > 40*n {
				t.Fatalf("%d kills in %d tries", got, tries)
			}
			ns := newPod()
			killed, _, at, err := run(ns, killDelay(median), args...)
			if !killed && err != nil {
				t.Fatalf("undisturbed run: %v", err)
			}
			why := "an undisturbed run"
			if killed {
				got++
				tally.add("iptables-init", at)
				why = fmt.Sprintf("a kill at %q (%s)", at.point, at.state)
			}
			if _, _, _, err := run(ns, 0, args...); err != nil {
				t.Fatalf("the run after %s: %v", why, err)
			}
			if diff := want.Diff(chaosPodSnapshot(t, ns)); len(diff) > 0 {
				t.Fatalf("after %s and a second run, against an undisturbed run:\n  %s", why, strings.Join(diff, "\n  "))
			}
			if _, _, _, err := run(ns, 0, "--cleanup-only"); err != nil {
				t.Fatal(err)
			}
			if diff := empty.Diff(chaosPodSnapshot(t, ns)); len(diff) > 0 {
				t.Fatalf("--cleanup-only after %s left:\n  %s", why, strings.Join(diff, "\n  "))
			}
			diff, err := host.HostDiff(nil, pods...)
			if err != nil {
				t.Fatal(err)
			}
			if len(diff) > 0 {
				t.Fatalf("the host after %s, a second run and --cleanup-only, against its snapshot:\n  %s", why, strings.Join(diff, "\n  "))
			}
		}
	})
	t.Run("meshwire install", func(t *testing.T) {
		h := harness.New(t)
		h.CheckNoLeaks()
		host, err := harness.StableSnapshot()
		if err != nil {
			t.Fatal(err)
		}
		fixture := installFixture(t, "10-flannel.conflist")
		install := func(binDir, confDir string, delay time.Duration) (killed bool, took time.Duration, at kill, err error) {
			return runOrKill(t, exec.Command(filepath.Join(h.BinDir, "meshwire"), "install", "--cni-bin-dir", binDir, "--cni-conf-dir", confDir, "--chain", "--once"), delay)
		}
		node := func() (string, string) {
			binDir, confDir := t.TempDir(), t.TempDir()
			if err := os.WriteFile(filepath.Join(confDir, "10-flannel.conflist"), fixture, 0o644); err != nil {
				t.Fatal(err)
			}
			return binDir, confDir
		}
		refBin, refConf := node()
		if _, _, _, err := install(refBin, refConf, 0); err != nil {
			t.Fatal(err)
		}
		want := dirState(t, refBin) + dirState(t, refConf)
		median := undisturbedMedian(t, 5, func() (time.Duration, error) {
			binDir, confDir := node()
			_, took, _, err := install(binDir, confDir, 0)
			return took, err
		})
		for got, tries := 0, 0; got < 2*n; tries++ {
			if tries > 40*n {
				t.Fatalf("%d kills in %d tries", got, tries)
			}
			binDir, confDir := node()
			killed, _, at, err := install(binDir, confDir, killDelay(median))
			if !killed && err != nil {
				t.Fatalf("undisturbed install: %v", err)
			}
			why := "an undisturbed install"
			if killed {
				got++
				tally.add("meshwire install", at)
				why = fmt.Sprintf("a kill at %q (%s)", at.point, at.state)
			}
			if _, _, _, err := install(binDir, confDir, 0); err != nil {
				t.Fatalf("the install after %s: %v", why, err)
			}
			if gotState := dirState(t, binDir) + dirState(t, confDir); gotState != want {
				t.Fatalf("after %s and a second install:\n%s\nwant, as an undisturbed install:\n%s", why, gotState, want)
			}
			diff, err := host.HostDiff(nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(diff) > 0 {
				t.Fatalf("the host after %s and a second install, against its snapshot:\n  %s", why, strings.Join(diff, "\n  "))
			}
		}
	})
}

// dirState lists a directory's files with their modes and contents' size
// and hash, under names relative to it.
func dirState(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h := fnv.New64a()
		h.Write(data)
		fmt.Fprintf(&b, "%s %v %d %x\n", rel, info.Mode(), len(data), h.Sum64())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
