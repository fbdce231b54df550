//go:build kernel

package e2e

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/killpoint"
	"github.com/meshwire/meshwire/internal/poll"
	"github.com/meshwire/meshwire/internal/probe"
	"github.com/meshwire/meshwire/test/harness"
)

// chaosKills is how many times, at least, each plugin is killed.
const chaosKills = 100

// chaosPlugin is one plugin of a conflist and its kill points.
type chaosPlugin struct {
	name     string
	add, del []string
}

// points are the plugin's kill points, as MESHWIRE_KILL_AT names them.
func (p chaosPlugin) points() []string {
	var out []string
	for _, pt := range p.add {
		out = append(out, p.name+":ADD:"+pt)
	}
	for _, pt := range p.del {
		out = append(out, p.name+":DEL:"+pt)
	}
	return out
}

// killed tells a plugin killed with SIGKILL from one that failed: libcni
// reports no CNI error for it, only the signal (or, killed after printing
// its result, an error object with nothing in it).
func killed(err error) bool {
	var e *types.Error
	return err != nil && (strings.Contains(err.Error(), "signal: killed") || errors.As(err, &e) && e.Code == 0 && e.Msg == "")
}

// withKill runs fn with the plugins told to die at point.
func withKill(t *testing.T, point string, fn func() error) error {
	t.Helper()
	if err := os.Setenv(killpoint.Env, point); err != nil {
		t.Fatal(err)
	}
	defer os.Unsetenv(killpoint.Env)
	return fn()
}

// chaosRun kills every plugin of list at each of its points, in rounds,
// until each was killed chaosKills times: an ADD killed at an ADD point,
// or a full ADD then a DEL killed at a DEL point, each followed by what a
// runtime does next (DEL with the same arguments, retried until it
// succeeds once). It returns how many times each plugin was killed.
func chaosRun(t *testing.T, h *harness.H, list string, caps map[string]any, plugins []chaosPlugin, pod func() *harness.NS) map[string]int {
	t.Helper()
	conf := h.ConfList(list)
	kills := map[string]int{}
	for _, p := range plugins {
		pts := p.points()
		for round := 0; kills[p.name] < chaosKills; round++ {
			for _, pt := range pts {
				ns := pod()
				a := h.Attach(conf, ns, "eth0", caps)
				var err error
				if strings.Contains(pt, ":ADD:") {
					_, err = func() (types.Result, error) {
						var r types.Result
						e := withKill(t, pt, func() (e error) { r, e = a.Add(); return e })
						return r, e
					}()
				} else {
					a.MustAdd()
					err = withKill(t, pt, a.Del)
				}
				if !killed(err) {
					t.Fatalf("round %d, %s: the plugin was not killed there (%v): the point is never reached", round, pt, err)
				}
				kills[p.name]++
				if err := a.Del(); err != nil {
					t.Fatalf("round %d, DEL after a kill at %s: %v", round, pt, err)
				}
			}
		}
	}
	return kills
}

// chaosReport logs the kills of each plugin.
func chaosReport(t *testing.T, kills map[string]int) {
	var names []string
	for n := range kills {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %d", n, kills[n]))
	}
	t.Logf("kills: %s", strings.Join(parts, ", "))
}

// TestChaosInterfacePlugins: bridge (host-local in process, ipMasq,
// gateway) with portmap and bandwidth chained, and veth (ipMasq), killed
// at every point of their ADD and DEL at least 100 times each, each kill
// followed by the runtime's DEL: nothing is left on the host (links,
// addresses, routes, rules of every backend, qdiscs, ifbs, files), no
// address stays reserved, a pod wired before the kills keeps working and
// survives GC, and the addresses handed out afterwards are distinct.
func TestChaosInterfacePlugins(t *testing.T) {
	harness.RequireRoot(t)
	dataDir := t.TempDir()
	for _, tc := range []struct {
		name, network, list string
		caps                map[string]any
		plugins             []chaosPlugin
	}{
		{
			name: "bridge+portmap+bandwidth", network: "mwt-chaos-br",
			list: fmt.Sprintf(`{"cniVersion":"1.1.0","name":"mwt-chaos-br","plugins":[
				{"type":"bridge","bridge":"mwtchaos0","isGateway":true,"ipMasq":true,"hostVethPrefix":"mwcb",
				 "ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"198.18.54.0/24"}]]}},
				{"type":"portmap","backend":"iptables","capabilities":{"portMappings":true}},
				{"type":"bandwidth","capabilities":{"bandwidth":true}}]}`, dataDir),
			caps: map[string]any{
				"portMappings": []map[string]any{{"hostPort": 33080, "containerPort": 80, "protocol": "tcp"}},
				"bandwidth":    map[string]any{"ingressRate": 10000000, "ingressBurst": 100000, "egressRate": 10000000, "egressBurst": 100000},
			},
			plugins: []chaosPlugin{
				{"bridge", []string{"enter", "bridge", "veth", "port", "allocated", "ipam wait", "addresses", "masquerade", "announce", "printed"},
					[]string{"enter", "ipam del", "masquerade del", "reference masquerade del", "firewall and veth del", "printed"}},
				{"portmap", []string{"enter", "rules IPv4", "rules", "printed"}, []string{"enter", "rules removed", "printed"}},
				{"bandwidth", []string{"enter", "ingress tbf", "ifb created", "ifb labelled", "redirect", "egress tbf", "printed"},
					[]string{"enter", "ingress tbf removed", "redirect removed", "printed"}},
			},
		},
		{
			name: "veth", network: "mwt-chaos-veth",
			list: fmt.Sprintf(`{"cniVersion":"1.1.0","name":"mwt-chaos-veth","plugins":[
				{"type":"veth","ipMasq":true,"hostVethPrefix":"mwcv",
				 "ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"198.18.55.0/24"}]]}}]}`, dataDir),
			plugins: []chaosPlugin{
				{"veth", []string{"enter", "veth", "allocated", "ipam wait", "addresses", "masquerade", "announce", "printed"},
					[]string{"enter", "ipam del", "masquerade del", "reference masquerade del", "firewall and veth del", "printed"}},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := harness.New(t)
			conf := h.ConfList(tc.list)
			t.Cleanup(func() { _, _ = harness.Run("ip", "link", "del", "mwtchaos0") })
			// A first pod makes the shared state (the bridge, portmap's
			// base chains, the node's caches) that outlives pods; it
			// stays through the kills and must keep working. The leak
			// check runs before its teardown.
			survivor := h.Attach(conf, h.NewNS("chaos"), "eth0", tc.caps)
			res := survivor.MustAdd()
			chaosSettled(t, "mwc", "mwtchaos")
			h.CheckNoLeaks(dataDir, "/run/meshwire")
			kills := chaosRun(t, h, tc.list, tc.caps, tc.plugins, func() *harness.NS { return h.NewNS("chaos") })
			chaosReport(t, kills)
			if n := harness.Reservations(t, dataDir, tc.network); n != 1 {
				t.Fatalf("%d addresses reserved after the kills and DELs, want the survivor's only", n)
			}
			if err := h.GC(conf, survivor.GCAttachment()); err != nil {
				t.Fatalf("GC: %v", err)
			}
			if err := survivor.Check(); err != nil {
				t.Fatalf("the survivor after the kills and GC: CHECK %v", err)
			}
			ip := chaosIPv4(t, res)
			if _, err := probe.Ping("", ip, 2*time.Second); err != nil {
				t.Fatalf("the host reaches the survivor at %s: %v", ip, err)
			}
			// Addresses handed out now are fresh and distinct.
			seen := map[string]bool{ip.String(): true}
			for i := 0; i < 3; i++ {
				a := h.Attach(conf, h.NewNS("chaos"), "eth0", tc.caps)
				got := chaosIPv4(t, a.MustAdd()).String()
				if seen[got] {
					t.Fatalf("address %s handed out twice", got)
				}
				seen[got] = true
				if err := a.Del(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// chaosSettled waits until the host's links named with one of prefixes
// have their IPv6 link-local address, past duplicate address detection:
// the kernel adds it, and its routes, a moment after the link comes up,
// which a snapshot taken earlier would count as the test's doing.
func chaosSettled(t *testing.T, prefixes ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pending := ""
		links, err := netlink.LinkList()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links {
			name := l.Attrs().Name
			if !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
				continue
			}
			addrs, err := netlink.AddrList(l, netlink.FAMILY_V6)
			if err != nil {
				t.Fatal(err)
			}
			ok := false
			for _, a := range addrs {
				if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
					ok = true
				}
			}
			if !ok {
				pending = name
			}
		}
		if pending == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has no settled IPv6 link-local address after 10 s", pending)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func chaosIPv4(t *testing.T, r *current.Result) net.IP {
	t.Helper()
	for _, ip := range r.IPs {
		if v4 := ip.Address.IP.To4(); v4 != nil {
			return v4
		}
	}
	t.Fatalf("no IPv4 address in %+v", r)
	return nil
}

// TestChaosLoopbackAndIntercept: loopback, and intercept chained after it
// (every pod of the network intercepted), killed at every point of ADD and
// DEL at least 100 times each; after the runtime's DEL nothing is left in
// the host's namespace nor in the pod's: the pod's whole network state
// (links, addresses, routes of every table, rules, sysctls, qdiscs, every
// firewall backend) is what it was before ADD, and the DEL after an
// interrupted one succeeds.
func TestChaosLoopbackAndIntercept(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	list := `{"cniVersion":"1.1.0","name":"mwt-chaos-icpt","plugins":[{"type":"loopback"},
		{"type":"intercept","istio-service-cidr":"*","istio-inbound-ports":"*","istio-inbound-interception-mode":"TPROXY","dual-stack":true}]}`
	type pod struct {
		ns     *harness.NS
		before *harness.Snapshot
	}
	var pods []pod
	kills := chaosRun(t, h, list, nil, []chaosPlugin{
		{"loopback", []string{"enter", "printed"}, []string{"enter", "printed"}},
		{"intercept", []string{"enter", "planned", "routing", "rules IPv4", "rules IPv6", "printed"}, []string{"enter", "printed"}},
	}, func() *harness.NS {
		ns := h.NewNS("chaos")
		// A pod with an IPv6 address, so that both families are programmed;
		// lo once up and down, as loopback's ADD and DEL leave it (the
		// kernel keeps 127.0.0.1 and its local routes on a lo set down).
		chaosPodSetup(t, ns, [][]string{{"ip", "link", "add", "eth9", "type", "veth", "peer", "name", "eth8"},
			{"ip", "addr", "add", "fd42:6d77::2/64", "dev", "eth9", "nodad"},
			{"ip", "link", "set", "lo", "up"}, {"ip", "link", "set", "lo", "down"}})
		// The kernel inserts the address's local route from a work
		// queue, even with nodad: on a busy machine after the
		// commands return (seen once in 104 pods: the route "added"
		// between this snapshot and the one after the DEL).
		if err := poll.Until(5*time.Second, func() bool {
			out, _ := ns.Exec("ip", "-6", "route", "show", "table", "local", "fd42:6d77::2")
			return strings.Contains(out, "fd42:6d77::2")
		}); err != nil {
			t.Fatalf("%s: the local route of fd42:6d77::2: %v", ns.Name, err)
		}
		pods = append(pods, pod{ns, chaosPodSnapshot(t, ns)})
		return ns
	})
	chaosReport(t, kills)
	for _, p := range pods {
		if diff := p.before.Diff(chaosPodSnapshot(t, p.ns)); len(diff) > 0 {
			t.Fatalf("%s after the DEL that followed a kill:\n  %s", p.ns.Name, strings.Join(diff, "\n  "))
		}
	}
}

// chaosIptablesInitArgs are the crash tests' iptables-init flags: TPROXY,
// both families, Istio's status ports excluded.
var chaosIptablesInitArgs = []string{"-m", "TPROXY", "-i", "*", "-b", "*", "-d", "15090,15021,15020", "--dual-stack"}

// chaosIptablesInitPod is a pod for iptables-init's crash tests: lo up,
// eth9 with both families' addresses, it and its peer up so that the
// addresses' local routes are there from the start (on a link without
// carrier the kernel adds them at the next address event, the run's ::6 on
// lo), without link-local addresses (random, and added late).
func chaosIptablesInitPod(t *testing.T, h *harness.H, prefix string) *harness.NS {
	t.Helper()
	ns := h.NewNS(prefix)
	chaosPodSetup(t, ns, [][]string{{"ip", "link", "set", "lo", "up"}, {"ip", "link", "add", "eth9", "type", "veth", "peer", "name", "eth8"},
		{"ip", "addr", "add", "198.18.56.2/24", "dev", "eth9"}, {"ip", "addr", "add", "fd42:6d78::2/64", "dev", "eth9", "nodad"},
		{"ip", "link", "set", "eth8", "addrgenmode", "none"}, {"ip", "link", "set", "eth9", "addrgenmode", "none"},
		{"ip", "link", "set", "eth8", "up"}, {"ip", "link", "set", "eth9", "up"}})
	return ns
}

// chaosPodSetup runs the commands that make a pod of ns.
func chaosPodSetup(t *testing.T, ns *harness.NS, cmds [][]string) {
	t.Helper()
	for _, c := range cmds {
		if out, err := ns.Exec(c[0], c[1:]...); err != nil {
			t.Fatalf("%q in %s: %v: %s", c, ns.Name, err, out)
		}
	}
}

// chaosPodSnapshot is the whole network state of a pod namespace.
func chaosPodSnapshot(t *testing.T, ns *harness.NS) *harness.Snapshot {
	t.Helper()
	s, err := harness.SnapshotNS(ns)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestChaosIptablesInit kills iptables-init at each point of its install,
// TPROXY with both families, at least 100 times, as an init container is
// killed; the runtime then starts the container again, as kubelet does: the
// second run installs exactly the rules of an undisturbed run (whatever
// the first left), and --cleanup-only then leaves nothing.
func TestChaosIptablesInit(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	bin := filepath.Join(h.BinDir, "iptables-init")
	args := chaosIptablesInitArgs
	newPod := func() *harness.NS { return chaosIptablesInitPod(t, h, "chaos") }
	run := func(ns *harness.NS, killAt string, a ...string) error {
		env := []string{}
		if killAt != "" {
			env = append(env, killpoint.Env+"=iptables-init:"+killAt)
		}
		out, err := ns.ExecEnv(env, bin, a...)
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
	fresh := newPod()
	empty := chaosPodSnapshot(t, fresh)
	ref := newPod()
	if err := run(ref, "", args...); err != nil {
		t.Fatal(err)
	}
	want := chaosPodSnapshot(t, ref)
	points := []string{"routing", "rules IPv4", "rules IPv6"}
	kills := 0
	for kills < chaosKills {
		for _, pt := range points {
			ns := newPod()
			if err := run(ns, pt, args...); err == nil || !strings.Contains(err.Error(), "signal: killed") {
				t.Fatalf("not killed at %s: %v", pt, err)
			}
			kills++
			if err := run(ns, "", args...); err != nil {
				t.Fatalf("the run after a kill at %s: %v", pt, err)
			}
			if diff := want.Diff(chaosPodSnapshot(t, ns)); len(diff) > 0 {
				t.Fatalf("after a kill at %s and a second run, against an undisturbed run:\n  %s", pt, strings.Join(diff, "\n  "))
			}
			if err := run(ns, "", "--cleanup-only"); err != nil {
				t.Fatal(err)
			}
			if diff := empty.Diff(chaosPodSnapshot(t, ns)); len(diff) > 0 {
				t.Fatalf("--cleanup-only left, against a fresh pod:\n  %s", strings.Join(diff, "\n  "))
			}
		}
	}
	t.Logf("kills: iptables-init %d", kills)
}
