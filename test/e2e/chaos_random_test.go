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
// below its own measured duration, wherever it is then. The state a kill
// reached is the last record the command logged (its debug log: steps and
// their names), so the report says how many distinct states the kills hit.
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

// killTally counts the kills of one test and the distinct states they
// reached, per command.
type killTally struct {
	mu     sync.Mutex
	kills  map[string]int
	states map[string]map[string]bool
}

func (k *killTally) add(cmd, state string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.kills == nil {
		k.kills, k.states = map[string]int{}, map[string]map[string]bool{}
	}
	k.kills[cmd]++
	if k.states[cmd] == nil {
		k.states[cmd] = map[string]bool{}
	}
	k.states[cmd][state] = true
}

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
		parts = append(parts, fmt.Sprintf("%s %d kills, %d states", n, k.kills[n], len(k.states[n])))
		total += k.kills[n]
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

// killAfter runs cmd, killed with SIGKILL after delay unless it ends
// first: only the command, as a runtime kills a plugin (its children, a
// firewall tool, must die with it), or with group its whole process group.
// It reports whether the kill landed and where: the programs of the group
// at that instant (a firewall tool the command ran, or only itself) and
// the system call its main thread was in.
func killAfter(cmd *exec.Cmd, delay time.Duration, group bool) (killed bool, where string, err error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return false, "", err
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
			where = processGroupState(cmd.Process.Pid)
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
		return true, where, err
	}
	return false, "", err
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
// long the run took, the state it reached, and its error (with its output
// when it ran to its end).
func runOrKill(t *testing.T, cmd *exec.Cmd, delay time.Duration) (killed bool, took time.Duration, state string, err error) {
	logFile := filepath.Join(t.TempDir(), "run.log")
	cmd.Env = append(os.Environ(), logging.EnvFile+"="+logFile, logging.EnvLevel+"=debug")
	start := time.Now()
	var where string
	if delay > 0 {
		killed, where, err = killAfter(cmd, delay, rand.IntN(2) == 0)
	} else if out, rerr := cmd.CombinedOutput(); rerr != nil {
		err = fmt.Errorf("%w: %s", rerr, out)
	}
	return killed, time.Since(start), lastState(logFile) + "; " + where, err
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
	fired     bool   // the armed command ran
	killed    bool   // and the kill landed
	state     string // what it logged last
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
	var where string
	var err error
	if arm {
		killed, where, err = killAfter(cmd, delay, k.n%2 == 0)
	} else {
		err = cmd.Run()
	}
	took := time.Since(start)
	defer os.Remove(logFile)
	k.mu.Lock()
	if arm {
		k.killed, k.state = killed, lastState(logFile)+"; "+where
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

// arm makes the next run of plugin's cmd die after a delay drawn below
// its median duration so far (times 1.2, so that the end is hit too).
func (k *killerExec) arm(plugin, cmd string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	name := plugin + " " + cmd
	d := slices.Clone(k.durations[name])
	slices.Sort(d)
	median := 20 * time.Millisecond
	if len(d) > 0 {
		median = d[len(d)/2]
	}
	k.armed, k.delay, k.fired, k.killed, k.state = name, time.Duration(rand.Int64N(int64(median)*6/5)+1), false, false, ""
}

// outcome is whether the armed command ran and was killed, and where.
func (k *killerExec) outcome() (fired, killed bool, state string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	fired, killed, state = k.fired, k.killed, k.state
	k.armed = ""
	return fired, killed, state
}

// chaosRandomRun kills each of plugins' ADD and DEL at random instants
// until each was killed n times, every kill followed by the runtime's
// DEL (retried until it succeeds once, at most 3 times), on pods from
// pod. after, when set, judges each pod once its DEL succeeded. The list
// first runs 3 undisturbed ADD+DEL cycles, which time the commands.
func chaosRandomRun(t *testing.T, h *harness.H, list *libcni.NetworkConfigList, caps map[string]any, args [][2]string, plugins []string, n int, tally *killTally, pod func() *harness.NS, after func(*harness.NS)) {
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
	del := func(a *harness.Attachment, ns *harness.NS, why string) {
		t.Helper()
		var err error
		for i := 0; i < 3; i++ {
			if err = a.Del(); err == nil {
				if after != nil {
					after(ns)
				}
				return
			}
		}
		t.Fatalf("the runtime's DEL after %s: %v", why, err)
	}
	for i := 0; i < 3; i++ {
		ns := pod()
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
				ns := pod()
				a := attach(ns)
				var err error
				if cmd == "ADD" {
					k.arm(p, cmd)
					_, err = a.Add()
				} else {
					a.MustAdd()
					k.arm(p, cmd)
					err = a.Del()
				}
				fired, killed, state := k.outcome()
				switch {
				case !fired:
					t.Fatalf("%s %s never ran (%v)", p, cmd, err)
				case killed:
					got++
					tally.add(p+" "+cmd, state)
				case err != nil:
					t.Fatalf("%s %s failed undisturbed: %v", p, cmd, err)
				}
				del(a, ns, fmt.Sprintf("%s %s killed at %q", p, cmd, state))
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
				var plugins []string
				for _, p := range list.Plugins {
					plugins = append(plugins, p.Network.Type)
				}
				chaosRandomRun(t, h, list, caps, nil, plugins, n, &tally, func() *harness.NS { return h.NewNS("rand") }, nil)
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
				fresh := map[string]*harness.Snapshot{}
				pod := func() *harness.NS {
					ns := h.NewNS("rand")
					chaosPodSetup(t, ns, [][]string{{"ip", "link", "add", "eth9", "type", "veth", "peer", "name", "eth8"},
						{"ip", "addr", "add", "198.18.59.2/24", "dev", "eth9"}, {"ip", "addr", "add", "fd42:6d79::2/64", "dev", "eth9", "nodad"},
						{"ip", "link", "set", "lo", "up"}, {"ip", "link", "set", "lo", "down"}})
					fresh[ns.Name] = chaosPodSnapshot(t, ns)
					return ns
				}
				after := func(ns *harness.NS) {
					if diff := fresh[ns.Name].Diff(chaosPodSnapshot(t, ns)); len(diff) > 0 {
						t.Fatalf("%s after its DEL, against the fresh pod:\n  %s", ns.Name, strings.Join(diff, "\n  "))
					}
				}
				chaosRandomRun(t, h, list, caps, args, []string{"loopback", "intercept"}, n, &tally, pod, after)
			})
		}
	})
	t.Run("iptables-init", func(t *testing.T) {
		h := harness.New(t)
		h.CheckNoLeaks()
		bin := filepath.Join(h.BinDir, "iptables-init")
		args := chaosIptablesInitArgs
		newPod := func() *harness.NS { return chaosIptablesInitPod(t, h, "rand") }
		// In the pod's namespace, through nsenter (so that the kill of its
		// process group takes iptables-init and what it runs).
		run := func(ns *harness.NS, delay time.Duration, a ...string) (killed bool, took time.Duration, state string, err error) {
			return runOrKill(t, exec.Command("nsenter", append([]string{"--net=" + ns.Path, bin}, a...)...), delay)
		}
		ref := newPod()
		_, took, _, err := run(ref, 0, args...)
		if err != nil {
			t.Fatal(err)
		}
		want := chaosPodSnapshot(t, ref)
		empty := chaosPodSnapshot(t, newPod())
		for got, tries := 0, 0; got < 2*n; tries++ {
			if tries > 40*n {
				t.Fatalf("%d kills in %d tries", got, tries)
			}
			ns := newPod()
			killed, _, state, err := run(ns, time.Duration(rand.Int64N(int64(took)*6/5)+1), args...)
			if !killed && err != nil {
				t.Fatalf("undisturbed run: %v", err)
			}
			if killed {
				got++
				tally.add("iptables-init", state)
			}
			if _, _, _, err := run(ns, 0, args...); err != nil {
				t.Fatalf("the run after a kill at %q: %v", state, err)
			}
			if diff := want.Diff(chaosPodSnapshot(t, ns)); len(diff) > 0 {
				t.Fatalf("after a kill at %q and a second run, against an undisturbed run:\n  %s", state, strings.Join(diff, "\n  "))
			}
			if _, _, _, err := run(ns, 0, "--cleanup-only"); err != nil {
				t.Fatal(err)
			}
			if diff := empty.Diff(chaosPodSnapshot(t, ns)); len(diff) > 0 {
				t.Fatalf("--cleanup-only after a kill at %q left:\n  %s", state, strings.Join(diff, "\n  "))
			}
		}
	})
	t.Run("meshwire install", func(t *testing.T) {
		h := harness.New(t)
		h.CheckNoLeaks()
		fixture := installFixture(t, "10-flannel.conflist")
		install := func(binDir, confDir string, delay time.Duration) (killed bool, took time.Duration, state string, err error) {
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
		_, took, _, err := install(refBin, refConf, 0)
		if err != nil {
			t.Fatal(err)
		}
		want := dirState(t, refBin) + dirState(t, refConf)
		for got, tries := 0, 0; got < 2*n; tries++ {
			if tries > 40*n {
				t.Fatalf("%d kills in %d tries", got, tries)
			}
			binDir, confDir := node()
			killed, _, state, err := install(binDir, confDir, time.Duration(rand.Int64N(int64(took)*6/5)+1))
			if !killed && err != nil {
				t.Fatalf("undisturbed install: %v", err)
			}
			if killed {
				got++
				tally.add("meshwire install", state)
			}
			if _, _, _, err := install(binDir, confDir, 0); err != nil {
				t.Fatalf("the install after a kill at %q: %v", state, err)
			}
			if gotState := dirState(t, binDir) + dirState(t, confDir); gotState != want {
				t.Fatalf("after a kill at %q and a second install:\n%s\nwant, as an undisturbed install:\n%s", state, gotState, want)
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
