//go:build kernel

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/cmd/meshwire/cli"
	"github.com/meshwire/meshwire/internal/cniruntime"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/probe"
	"github.com/meshwire/meshwire/test/harness"
)

// meshwireCmd runs the built meshwire command with its own state directory.
type meshwireCmd struct {
	t        *testing.T
	bin      string
	stateDir string
	cniPath  string
}

func newMeshwireCmd(t *testing.T) *meshwireCmd {
	h := harness.New(t)
	return &meshwireCmd{t: t, bin: filepath.Join(h.BinDir, "meshwire"), stateDir: t.TempDir(), cniPath: h.BinDir}
}

// meshwireTestBridge is the bridge of meshwireConflist.
const meshwireTestBridge = "mwt-cmdbr0"

// meshwireConflist writes the default chain (bridge + host-local + portmap +
// bandwidth) on the test's own bridge, range and data directory, and removes
// the bridge at cleanup (the bridge plugin keeps bridges on DEL).
func meshwireConflist(t *testing.T) string {
	dir := t.TempDir()
	conf := filepath.Join(dir, "test.conflist")
	err := os.WriteFile(conf, []byte(`{"cniVersion":"1.1.0","name":"mwt-cmd","plugins":[
	  {"type":"bridge","bridge":"`+meshwireTestBridge+`","isGateway":true,"ipMasq":true,"hairpinMode":true,
	   "ipam":{"type":"host-local","dataDir":"`+filepath.Join(dir, "ipam")+`",
	           "ranges":[[{"subnet":"198.18.240.0/24"}],[{"subnet":"fdf0:6d77::/64"}]],
	           "routes":[{"dst":"0.0.0.0/0"}]}},
	  {"type":"portmap","capabilities":{"portMappings":true}},
	  {"type":"bandwidth","capabilities":{"bandwidth":true}}]}`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(meshwireTestBridge); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	return conf
}

func (m *meshwireCmd) run(args ...string) (stdout, stderr string, code int) {
	m.t.Helper()
	cmd := exec.Command(m.bin, append(args, "--state-dir", m.stateDir, "--cni-path", m.cniPath)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		m.t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func (m *meshwireCmd) mustRun(args ...string) string {
	m.t.Helper()
	out, errOut, code := m.run(args...)
	if code != 0 {
		m.t.Fatalf("meshwire %v: exit %d: %s%s", args, code, out, errOut)
	}
	return out
}

func TestMeshwireLifecycle(t *testing.T) {
	m := newMeshwireCmd(t)
	h := harness.New(t)
	nodeBaseline(t)
	h.CheckNoLeaks()
	conf := meshwireConflist(t)
	name := "mwt-cmd-" + harness.RandomID()[:6]
	t.Cleanup(func() { m.run("del", name); _ = netns.Delete(name) })

	out := m.mustRun("add", name, "--conf", conf, "--port", "30990:80", "--bandwidth", "10mbit")
	if !strings.Contains(out, "lo 127.0.0.1/8") || !strings.Contains(out, "eth0 198.18.240.") {
		t.Fatalf("add output lacks the addresses:\n%s", out)
	}
	if !netns.Exists(name) {
		t.Fatal("add did not create the namespace")
	}
	ns := &harness.NS{Name: name, Path: netns.Path(name)}
	if _, err := probePing(ns.Path, "127.0.0.1"); err != nil {
		t.Fatalf("lo does not answer in the wired namespace: %v", err)
	}
	// The capabilities reached the plugins: the host port answers and the
	// pod's host veth carries a shaping qdisc.
	l, err := probe.Listen(ns.Path, "tcp", ":80")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for c, err := l.Accept(); err == nil; c, err = l.Accept() {
			c.Write([]byte("pod\n"))
			c.Close()
		}
	}()
	if got, err := meshwireFetch("127.0.0.1:30990"); err != nil || got != "pod" {
		t.Fatalf("host port 30990 -> pod:80: %q, %v", got, err)
	}
	if out, _ := harness.Run("tc", "qdisc", "show"); !strings.Contains(out, "tbf") {
		t.Fatalf("--bandwidth installed no tbf qdisc:\n%s", out)
	}

	if _, errOut, code := m.run("add", name, "--conf", conf); code != 1 || !strings.Contains(errOut, "already wired") {
		t.Fatalf("second add: exit %d, %q; want 1 and 'already wired'", code, errOut)
	}
	m.mustRun("check", name)
	ls := m.mustRun("ls")
	if !strings.Contains(ls, name) || !strings.Contains(ls, "lo=127.0.0.1/8") || !strings.Contains(ls, "eth0=198.18.240.") {
		t.Fatalf("ls does not show the pod and its addresses:\n%s", ls)
	}
	var pods []cniruntime.Pod
	if err := json.Unmarshal([]byte(m.mustRun("ls", "-o", "json")), &pods); err != nil {
		t.Fatalf("ls -o json: %v", err)
	}
	if i := slices.IndexFunc(pods, func(p cniruntime.Pod) bool { return p.Name == name }); i < 0 ||
		!slices.Contains(pods[i].Networks, cniruntime.PodNetwork{Network: "mwt-cmd", IfName: "eth0"}) ||
		!slices.ContainsFunc(pods[i].Addresses, func(a cniruntime.PodAddress) bool {
			return a.IfName == "eth0" && strings.HasPrefix(a.Address, "198.18.240.")
		}) {
		t.Fatalf("ls -o json does not show the pod, its network and its address: %+v", pods)
	}
	if out := m.mustRun("gc", "--conf", conf); !strings.Contains(out, "mwt-cmd") {
		t.Fatalf("gc output: %s", out)
	}
	m.mustRun("check", name) // GC kept the valid attachment

	// CHECK notices when the pod's networking is broken behind its back.
	if o, err := harness.Run("ip", "netns", "exec", name, "ip", "link", "set", "lo", "down"); err != nil {
		t.Fatalf("%v: %s", err, o)
	}
	if _, errOut, code := m.run("check", name); code != 1 || !strings.Contains(errOut, "lo is down") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Fatalf("check of a broken pod: exit %d, stderr %q; want exit 1 and one line saying lo is down", code, errOut)
	}

	if out := m.mustRun("del", name); !strings.Contains(out, "namespace removed") {
		t.Fatalf("del output: %s", out)
	}
	if netns.Exists(name) {
		t.Fatal("del left the namespace")
	}
	if ls := m.mustRun("ls"); strings.Contains(ls, name) {
		t.Fatalf("ls still lists the deleted pod:\n%s", ls)
	}
}

// TestMeshwireLoopbackOnly: a conflist made of loopback alone is attached
// on lo, without the separate loopback network.
func TestMeshwireLoopbackOnly(t *testing.T) {
	m := newMeshwireCmd(t)
	h := harness.New(t)
	nodeBaseline(t)
	h.CheckNoLeaks()
	conf := filepath.Join(t.TempDir(), "lo.conflist")
	os.WriteFile(conf, []byte(`{"cniVersion":"1.1.0","name":"mwt-lo","plugins":[{"type":"loopback"}]}`), 0o644)
	name := "mwt-cmd-" + harness.RandomID()[:6]
	t.Cleanup(func() { _ = netns.Delete(name) })
	out := m.mustRun("add", name, "--conf", conf)
	if !strings.Contains(out, "network mwt-lo on lo") || strings.Contains(out, "meshwire-loopback") {
		t.Fatalf("add output:\n%s", out)
	}
	m.mustRun("check", name)
	m.mustRun("del", name)
}

// TestMeshwireAdoptsExistingNamespace: a namespace made by someone else is
// wired, and del leaves it in place.
func TestMeshwireAdoptsExistingNamespace(t *testing.T) {
	m := newMeshwireCmd(t)
	h := harness.New(t)
	ns := h.NewNS("cmd")
	m.mustRun("add", ns.Name, "--conf", meshwireConflist(t))
	t.Cleanup(func() { m.run("del", ns.Name) })
	if !ns.IsUp("lo") {
		t.Fatal("lo not up after add")
	}
	if out := m.mustRun("del", ns.Name); !strings.Contains(out, "kept") {
		t.Fatalf("del output: %s", out)
	}
	if !netns.Exists(ns.Name) {
		t.Fatal("del removed a namespace meshwire did not create")
	}
}

func TestMeshwireErrors(t *testing.T) {
	m := newMeshwireCmd(t)
	cases := []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "no command"},
		{[]string{"frob"}, 2, "unknown command"},
		{[]string{"add"}, 2, "NAME"},
		{[]string{"add", "a", "b"}, 2, "NAME"},
		{[]string{"add", "x", "--port", "99999:80"}, 2, "host port"},
		{[]string{"add", "x", "--bandwidth", "fast"}, 2, "--bandwidth"},
		{[]string{"add", "x", "--nope"}, 2, "nope"},
		{[]string{"add", "bad/name"}, 1, "invalid namespace name"},
		{[]string{"add", "x", "--conf", "/nonexistent.conflist"}, 1, "--conf"},
		{[]string{"check", "mwt-never-added"}, 1, "not wired by meshwire"},
		{[]string{"del", "mwt-never-added"}, 1, "not wired by meshwire"},
	}
	for _, c := range cases {
		_, errOut, code := m.run(c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("meshwire %v: exit %d, stderr %q; want exit %d mentioning %q", c.args, code, errOut, c.code, c.want)
		}
	}
	// A conflist naming a plugin that is not installed: one clear line, and
	// the namespace it created is gone again.
	conf := filepath.Join(t.TempDir(), "missing.conflist")
	os.WriteFile(conf, []byte(`{"cniVersion":"1.1.0","name":"mwt-missing","plugins":[{"type":"no-such-plugin"}]}`), 0o644)
	name := "mwt-cmd-" + harness.RandomID()[:6]
	t.Cleanup(func() { _ = netns.Delete(name) })
	_, errOut, code := m.run("add", name, "--conf", conf)
	if code != 1 || !strings.Contains(errOut, "no-such-plugin") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Fatalf("add with a missing plugin: exit %d, stderr %q", code, errOut)
	}
	if netns.Exists(name) {
		t.Fatal("failed add left its namespace behind")
	}
}

func TestMeshwireDemo(t *testing.T) {
	m := newMeshwireCmd(t)
	h := harness.New(t)
	nodeBaseline(t)
	h.CheckNoLeaks()
	out := m.mustRun("demo")
	for _, step := range []string{"reaches mwdemo-b at", "the host reaches mwdemo-b", "host port 127.0.0.1:8080 reaches mwdemo-b:80", "is shaped to 10mbit", "mwdemo-b: CNI CHECK passes", "removed bridge mw0",
		"mwdemo-mesh app -> ", "original destination", "goes through the sidecar (proxy log: inbound from", "mwdemo-mesh: the eBPF fast path carried sidecar <-> app bytes", "(0 kept from the proxy)",
		"eBPF fast path: both directions for mwdemo-mesh", "mwdemo-mesh: CNI CHECK passes",
		"ok    mwdemo-ambient wired with the intercept plugin chained, annotated istio.io/dataplane-mode=ambient",
		"ok    mwdemo-ambient enrolled and handed to ztunnel (ztunnel log: add workload uid-mwdemo-ambient",
		"ok    mwdemo-ambient app -> ", "goes through ztunnel (ztunnel log: outbound from ",
		"goes through ztunnel, the app sees mwdemo-a (ztunnel log: inbound from ",
		"ok    the host reaches mwdemo-ambient app at ", "uncaptured, from the probe address 169.254.7.127 (the host rule's SNAT",
		"ok    DEL of mwdemo-ambient tells ztunnel the pod is gone (ztunnel log: del workload uid-mwdemo-ambient; 0 pod(s) enrolled)",
		"ok    ambient mode stopped: the host's probe rule and probe sets removed"} {
		if !strings.Contains(out, step) {
			t.Errorf("demo output lacks %q", step)
		}
	}
	if strings.Contains(out, "FAIL") || !strings.Contains(out, "ok    mwdemo-a: lo answers ping on 127.0.0.1") || !strings.Contains(out, "no namespace left behind") {
		t.Fatalf("demo output:\n%s", out)
	}
}

// TestMeshwireDemoInterrupted: Ctrl-C while the demo holds its pods removes
// everything.
func TestMeshwireDemoInterrupted(t *testing.T) {
	seen := demoInterrupted(t, "holding the pods", "--hold", "60s")
	if !strings.Contains(seen, "no namespace left behind") {
		t.Fatalf("no cleanup report:\n%s", seen)
	}
}

// TestMeshwireDemoInterruptedAmbient: Ctrl-C in the middle of the ambient
// part deletes the ambient pod before its agent stops, so that the host
// rule and the probe sets go too, and leaves no ztunnel stand-in running.
func TestMeshwireDemoInterruptedAmbient(t *testing.T) {
	seen := demoInterrupted(t, "  ok    mwdemo-ambient enrolled and handed to ztunnel")
	for _, want := range []string{"ok    ambient mode stopped: the host's probe rule and probe sets removed", "no namespace left behind"} {
		if !strings.Contains(seen, want) {
			t.Fatalf("output lacks %q:\n%s", want, seen)
		}
	}
	if out, _ := exec.Command("ipset", "list", "-n").CombinedOutput(); strings.Contains(string(out), "istio-inpod-probes") {
		t.Fatalf("probe sets left: %s", out)
	}
	if out, _ := exec.Command("pgrep", "-f", "meshwire-demo-ztunnel-").CombinedOutput(); len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("the ztunnel stand-in outlived the demo: pids %s", out)
	}
}

// demoInterrupted runs the demo with args, interrupts it (SIGINT) at the
// first line that starts with at, and checks that it exits 1 within 30s
// leaving no namespace of its pods; it returns the demo's output.
func demoInterrupted(t *testing.T, at string, args ...string) string {
	t.Helper()
	m := newMeshwireCmd(t)
	h := harness.New(t)
	nodeBaseline(t)
	h.CheckNoLeaks()
	cmd := exec.Command(m.bin, append([]string{"demo", "--state-dir", m.stateDir, "--cni-path", m.cniPath}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	sc := bufio.NewScanner(stdout)
	var seen []string
	for sc.Scan() {
		seen = append(seen, sc.Text())
		if strings.HasPrefix(sc.Text(), at) {
			break
		}
	}
	if !netns.Exists("mwdemo-a") || !netns.Exists("mwdemo-b") {
		t.Fatalf("demo pods not there at %q; output:\n%s", at, strings.Join(seen, "\n"))
	}
	start := time.Now()
	_ = cmd.Process.Signal(syscall.SIGINT)
	for sc.Scan() {
		seen = append(seen, sc.Text())
	}
	err = cmd.Wait()
	if time.Since(start) > 30*time.Second {
		t.Fatal("demo took too long to clean up after the interrupt")
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("interrupted demo: %v, want exit 1; output:\n%s", err, strings.Join(seen, "\n"))
	}
	for _, name := range []string{"mwdemo-a", "mwdemo-b", "mwdemo-mesh", "mwdemo-ambient"} {
		if netns.Exists(name) {
			t.Fatalf("interrupted demo left namespace %s; output:\n%s", name, strings.Join(seen, "\n"))
		}
	}
	return strings.Join(seen, "\n")
}

func meshwireFetch(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	b, err := io.ReadAll(c)
	return strings.TrimSpace(string(b)), err
}

// TestMeshwireHelp: the built binary prints every command's usage on
// stdout for --help and `help CMD` (exit 0, every flag named), a usage
// error's message and usage on stderr (exit 2), and a bash completion
// script that bash loads.
func TestMeshwireHelp(t *testing.T) {
	bin := filepath.Join(harness.New(t).BinDir, "meshwire")
	run := func(args ...string) (string, string, int) {
		cmd := exec.Command(bin, args...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden {
			return
		}
		path := strings.Fields(strings.TrimPrefix(c.CommandPath(), "meshwire"))
		for _, args := range [][]string{append(slices.Clone(path), "--help"), append([]string{"help"}, path...)} {
			out, errOut, code := run(args...)
			if code != 0 || errOut != "" || !strings.Contains(out, "Usage:\n  "+c.CommandPath()) {
				t.Errorf("meshwire %q: exit %d, stderr %q, stdout:\n%s", args, code, errOut, out)
				continue
			}
			c.Flags().VisitAll(func(f *pflag.Flag) {
				if !strings.Contains(out, "--"+f.Name) {
					t.Errorf("meshwire %q does not name --%s:\n%s", args, f.Name, out)
				}
			})
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(cli.Commands())

	out, errOut, code := run("install", "--cni-bin-dir")
	if first, _, _ := strings.Cut(errOut, "\n"); code != 2 || out != "" || first != "meshwire: install: flag needs an argument: --cni-bin-dir" ||
		!strings.Contains(errOut, "Usage:\n  meshwire install ") || !strings.Contains(errOut, "--cni-conf-dir DIR") {
		t.Errorf("usage error: exit %d, stdout %q, stderr:\n%s", code, out, errOut)
	}

	// fastpath status: -o json is the --json object the tests read.
	pins := t.TempDir()
	asJSON, _, code1 := run("fastpath", "status", "--json", "--pin-dir", pins)
	withO, _, code2 := run("fastpath", "status", "-o", "json", "--pin-dir", pins)
	var st struct {
		Attached bool   `json:"attached"`
		PinDir   string `json:"pin_dir"`
	}
	if code1 != 0 || code2 != 0 || asJSON != withO || json.Unmarshal([]byte(withO), &st) != nil || st.Attached || st.PinDir != pins {
		t.Errorf("fastpath status --json (exit %d) and -o json (exit %d) differ or are not the status:\n%s\n%s", code1, code2, asJSON, withO)
	}

	b, err := exec.Command("bash", "-c", "source <("+bin+" completion bash) && complete -p meshwire").CombinedOutput()
	if err != nil || !strings.Contains(string(b), "-F __start_meshwire meshwire") {
		t.Errorf("bash does not load `meshwire completion bash`: %v\n%s", err, b)
	}
}
