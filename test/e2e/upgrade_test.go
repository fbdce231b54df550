//go:build kernel

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/probe"
	"github.com/meshwire/meshwire/test/harness"
)

// Addresses and names of the in-place upgrade tests: pods in
// 198.18.200.0/24 and fd50:200::/64 behind a bridge mwtug<random> the
// reference plugins create; the outside client behind a veth pair, host
// end 198.18.201.1/30, client .2. Host ports 32000-32099.
const (
	upHost4   = "198.18.201.1"
	upClient4 = "198.18.201.2"
)

// upgradeVariant is how the reference set the pods up: which release, and
// which firewall its ipMasq and portmap wrote to.
type upgradeVariant struct {
	name string
	// v191 picks the reference v1.9.1 (built from the module proxy), else
	// Debian's 1.1.1 in /usr/lib/cni.
	v191 bool
	// iptables is the variant `iptables` runs for the reference: "nft" or
	// "legacy".
	iptables string
	// nftables sets ipMasqBackend and backend to nftables (v1.9.1 only).
	nftables bool
}

var upgradeVariants = []upgradeVariant{
	{"v1.9.1 iptables-nft", true, "nft", false},
	{"v1.9.1 iptables-legacy", true, "legacy", false},
	{"v1.9.1 nftables", true, "nft", true},
	{"1.1.1 iptables-nft", false, "nft", false},
	{"1.1.1 iptables-legacy", false, "legacy", false},
}

// upgradeEnv is one test's node: pods set up by the reference, torn down by
// meshwire's binaries with the same libcni cache, as after a switch of the
// binaries in /opt/cni/bin.
type upgradeEnv struct {
	h       *harness.H
	v       upgradeVariant
	ref     *libcni.CNIConfig
	refPath string // PATH with the variant's iptables first
	br      string
	dataDir string
	name    string
	outside *harness.NS
}

func newUpgradeEnv(t *testing.T, v upgradeVariant) *upgradeEnv {
	t.Helper()
	refDir := "/usr/lib/cni"
	if v.v191 {
		refDir = harness.ReferenceBinDir(t)
	} else if _, err := os.Stat(filepath.Join(refDir, "portmap")); err != nil {
		t.Fatalf("Debian's reference plugins 1.1.1 (apt package containernetworking-plugins): %v", err)
	}
	h := harness.New(t)
	nodeBaseline(t)
	shared := sharedHostportLines(t)
	// Runs after the leak check (cleanups run last registered first): a
	// failed test must not leave the reference's rules to the next, nor
	// take the shared chains the host had before it.
	t.Cleanup(func() { upgradeScrub(t, shared) })
	e := &upgradeEnv{h: h, v: v, br: "mwtug" + harness.RandomID()[:6], dataDir: t.TempDir(), name: "mwtup-" + harness.RandomID()[:6]}
	h.CheckNoLeaks()
	// Runs before the leak check. The shared state this test may remove
	// on purpose: meshwire's DEL (or GC) of the last reference attachment
	// on the node removes the reference portmap's shared CNI-HOSTPORT-*
	// chains and their jumps, also when they were on the host before the
	// test (another reference install left them empty). Those lines, and
	// only those, are put back as they were before the leak check judges
	// the rest.
	t.Cleanup(func() { restoreSharedHostport(t, shared) })
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(e.br); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	e.ref = libcni.NewCNIConfigWithCacheDir([]string{refDir}, h.CacheDir, nil)
	e.refPath = iptablesPath(t, v.iptables) + ":" + os.Getenv("PATH")
	e.outside = h.NewOutside("upout", "mwtuo"+harness.RandomID()[:6], []string{upHost4 + "/30"}, []string{upClient4 + "/30"})
	return e
}

// iptablesPath is a directory whose iptables tools are those of one variant
// ("nft" or "legacy"), for the reference's go-iptables, which runs whatever
// `iptables` is on PATH.
func iptablesPath(t *testing.T, variant string) string {
	t.Helper()
	dir := t.TempDir()
	for _, tool := range []string{"iptables", "ip6tables", "iptables-save", "ip6tables-save", "iptables-restore", "ip6tables-restore"} {
		base, suffix, _ := strings.Cut(tool, "-")
		name := base + "-" + variant
		if suffix != "" {
			name += "-" + suffix
		}
		target, err := exec.LookPath(name)
		if err != nil {
			t.Fatalf("iptables variant %s: %v", variant, err)
		}
		if err := os.Symlink(target, filepath.Join(dir, tool)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// upgradeScrub removes whatever the reference plugins left on the host:
// every CNI-* chain of the nat tables with the built-in chains' jumps to
// them, and the reference's nftables tables.
func upgradeScrub(t *testing.T, keep map[string][]string) {
	t.Helper()
	for _, v := range []string{"nft", "legacy"} {
		for _, fam := range []string{"iptables", "ip6tables"} {
			tool := fam + "-" + v
			out, err := exec.Command(tool+"-save", "-t", "nat").Output()
			if err != nil {
				t.Errorf("%s-save: %v", tool, err)
				continue
			}
			kept := map[string]bool{}
			for _, l := range keep[tool] {
				kept[l] = true
			}
			var del, chains []string
			for _, l := range strings.Split(string(out), "\n") {
				if kept[l] {
					continue
				}
				if name, ok := strings.CutPrefix(l, ":CNI-"); ok {
					chains = append(chains, "CNI-"+strings.Fields(name)[0])
				}
				for _, builtin := range []string{"PREROUTING", "OUTPUT", "POSTROUTING"} {
					if strings.HasPrefix(l, "-A "+builtin+" ") && strings.Contains(l, " -j CNI-") {
						del = append(del, "-D"+strings.TrimPrefix(l, "-A"))
					}
				}
			}
			for _, c := range chains {
				del = append(del, "-F "+c)
			}
			for _, c := range chains {
				del = append(del, "-X "+c)
			}
			if err := natRestore(tool, del...); err != nil {
				t.Errorf("scrub %s: %v", tool, err)
			}
		}
	}
	for _, tb := range []string{"inet " + attachment.RefMasqTable, "ip " + attachment.RefHostportTable, "ip6 " + attachment.RefHostportTable} {
		_ = exec.Command("nft", append([]string{"delete", "table"}, strings.Fields(tb)...)...).Run()
	}
}

// list is the conflist both implementations run: bridge with ipMasq and
// host-local (dual stack), then portmap.
func (e *upgradeEnv) list(cniVersion string) *libcni.NetworkConfigList {
	bridge := map[string]any{
		"type": "bridge", "bridge": e.br, "isGateway": true, "ipMasq": true, "hairpinMode": true,
		"ipam": map[string]any{
			"type": "host-local", "dataDir": e.dataDir,
			"ranges": [][]map[string]string{{{"subnet": "198.18.200.0/24"}}, {{"subnet": "fd50:200::/64"}}},
			"routes": []map[string]string{{"dst": "0.0.0.0/0"}, {"dst": "::/0"}},
		},
	}
	pm := map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}}
	if e.v.nftables {
		bridge["ipMasqBackend"] = "nftables"
		pm["backend"] = "nftables"
	}
	b, _ := json.Marshal(map[string]any{"cniVersion": cniVersion, "name": e.name, "plugins": []any{bridge, pm}})
	return e.h.ConfList(string(b))
}

// refList is the conflist in the newest version the reference release
// speaks.
func (e *upgradeEnv) refList() *libcni.NetworkConfigList {
	if e.v.v191 {
		return e.list("1.1.0")
	}
	return e.list("1.0.0")
}

// upPod is a pod whose TCP server on port answers with the pod's name.
type upPod struct {
	name string
	ns   *harness.NS
	att  *harness.Attachment
}

// refPods sets up pods A and B with the reference plugins, mapping
// portA and portB, and checks that the reference's objects of each are
// there.
func (e *upgradeEnv) refPods(t *testing.T, portA, portB int) (a, b *upPod) {
	t.Helper()
	a, b = e.refPod(t, "A", portA), e.refPod(t, "B", portB)
	e.wantRefObjects(t, a)
	e.wantRefObjects(t, b)
	return a, b
}

// refPod sets a pod up with the reference plugins, mapping hostPort to its
// port 80. Its DEL at cleanup runs meshwire's binaries.
func (e *upgradeEnv) refPod(t *testing.T, name string, hostPort int) *upPod {
	t.Helper()
	p := &upPod{name: name, ns: e.h.NewNS("up")}
	p.att = e.h.Attach(e.refList(), p.ns, "eth0", portmapCaps(pmPort{hostPort, 80, "tcp", ""}))
	old := os.Getenv("PATH")
	os.Setenv("PATH", e.refPath)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	_, err := e.ref.AddNetworkList(ctx, p.att.List, p.att.RT)
	cancel()
	os.Setenv("PATH", old)
	if err != nil {
		t.Fatalf("reference ADD of %s: %v", name, err)
	}
	upServe(t, p, 80)
	return p
}

// meshwirePod sets a pod up with meshwire's plugins, mapping hostPort to
// its port 8080.
func (e *upgradeEnv) meshwirePod(t *testing.T, name string, hostPort int) *upPod {
	t.Helper()
	p := &upPod{name: name, ns: e.h.NewNS("up")}
	p.att = e.h.Attach(e.refList(), p.ns, "eth0", portmapCaps(pmPort{hostPort, 8080, "tcp", ""}))
	p.att.MustAdd()
	upServe(t, p, 8080)
	return p
}

func upServe(t *testing.T, p *upPod, port int) {
	t.Helper()
	ln, err := probe.Listen(p.ns.Path, "tcp4", fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		t.Fatalf("listen in %s: %v", p.name, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s\n", p.name)
			c.Close()
		}
	}()
}

// reach connects from the outside client to the host port and returns the
// name of the pod that answered.
func (e *upgradeEnv) reach(port int) (string, error) {
	c, err := probe.Dial(e.outside.Path, "tcp", net.JoinHostPort(upHost4, fmt.Sprint(port)), 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func (e *upgradeEnv) mustReach(t *testing.T, port int, want string) {
	t.Helper()
	got, err := e.reach(port)
	if err != nil || got != want {
		t.Fatalf("outside -> host port %d: answered %q (%v), want pod %s\nfirewall:\n%s", port, got, err, want, upFirewall(t))
	}
}

// upFirewall is the host's whole firewall state, of every backend.
func upFirewall(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, tool := range []string{"iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save", "ip6tables-legacy-save"} {
		out, err := exec.Command(tool, "-t", "nat").CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", tool, err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if l != "" && !strings.HasPrefix(l, "#") {
				fmt.Fprintf(&b, "%s: %s\n", tool, l)
			}
		}
	}
	out, err := exec.Command("nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list ruleset: %v: %s", err, out)
	}
	b.Write(out)
	return b.String()
}

// refLines are the lines of the host's firewall that belong to the
// reference's objects of pod p: its chains, and rules naming its
// container id or its nftables ipMasq key.
func (e *upgradeEnv) refLines(t *testing.T, p *upPod) []string {
	t.Helper()
	r := attachment.Reference{Network: e.name, ContainerID: p.att.RT.ContainerID, IfName: p.att.RT.IfName}
	keys := []string{r.MasqChain(), r.PortmapDNATChain(), r.PortmapSNATChain(), r.MasqNftKey(), r.ContainerID}
	var lines []string
	for _, l := range strings.Split(upFirewall(t), "\n") {
		for _, k := range keys {
			if strings.Contains(l, k) {
				lines = append(lines, l)
				break
			}
		}
	}
	return lines
}

// wantRefObjects checks that the reference set p up in the form the
// variant asks for: ipMasq and portmap, both families.
func (e *upgradeEnv) wantRefObjects(t *testing.T, p *upPod) {
	t.Helper()
	r := attachment.Reference{Network: e.name, ContainerID: p.att.RT.ContainerID, IfName: p.att.RT.IfName}
	fw := upFirewall(t)
	var want []string
	if e.v.nftables {
		want = []string{"table inet " + attachment.RefMasqTable, r.MasqNftKey(), "table ip " + attachment.RefHostportTable, "table ip6 " + attachment.RefHostportTable, `comment "` + r.ContainerID + `"`}
	} else {
		for _, fam := range []string{"iptables", "ip6tables"} {
			tool := fam + "-" + e.v.iptables + "-save: "
			want = append(want, tool+":"+r.MasqChain(), tool+"-A POSTROUTING -s", tool+":"+r.PortmapDNATChain(), tool+"-A "+attachment.RefHostportDNAT+" ")
		}
	}
	for _, w := range want {
		if !strings.Contains(fw, w) {
			t.Fatalf("the reference did not set %s up as expected: no %q in\n%s", p.name, w, fw)
		}
	}
}

func (e *upgradeEnv) wantNoRefLines(t *testing.T, when string, pods ...*upPod) {
	t.Helper()
	for _, p := range pods {
		if l := e.refLines(t, p); len(l) > 0 {
			t.Fatalf("%s: the reference's rules of %s remain:\n%s", when, p.name, strings.Join(l, "\n"))
		}
	}
}

// TestUpgradeDel: pods set up by the reference plugins, then torn down by
// meshwire's DEL after the node switched. DEL removes what the reference's
// DEL would have removed for that pod and nothing of another pod's; the
// host port then belongs to whoever maps it next; once the last reference
// pod is gone nothing of the reference's is left on the host (the leak
// check).
func TestUpgradeDel(t *testing.T) {
	for i, v := range upgradeVariants {
		t.Run(v.name, func(t *testing.T) {
			e := newUpgradeEnv(t, v)
			portA, portB := 32000+10*i, 32000+10*i+1
			a, b := e.refPods(t, portA, portB)
			e.mustReach(t, portA, "A")

			if err := a.att.Del(); err != nil {
				t.Fatalf("meshwire DEL of a reference pod: %v", err)
			}
			e.wantNoRefLines(t, "after meshwire's DEL", a)
			e.wantRefObjects(t, b)
			e.mustReach(t, portB, "B")

			c := e.meshwirePod(t, "C", portA)
			e.mustReach(t, portA, "C")

			if err := a.att.Del(); err != nil {
				t.Fatalf("second DEL: %v", err)
			}
			for _, p := range []*upPod{b, c} {
				if err := p.att.Del(); err != nil {
					t.Fatalf("DEL of %s: %v", p.name, err)
				}
			}
			e.wantNoRefLines(t, "after every DEL", b)
		})
	}
}

// TestUpgradeGC: pods set up by the reference plugins, then collected by
// meshwire's GC (the runtime lost them: no cached attachment, so libcni
// sends no DEL) with nothing of theirs in the valid list.
func TestUpgradeGC(t *testing.T) {
	for i, v := range upgradeVariants {
		t.Run(v.name, func(t *testing.T) {
			e := newUpgradeEnv(t, v)
			portA, portB := 32050+10*i, 32050+10*i+1
			a, b := e.refPods(t, portA, portB)

			// A fresh libcni cache: GC reaches the plugins alone. The valid
			// list names a container that does not exist (libcni leaves
			// the key out when the list is empty).
			gc := libcni.NewCNIConfigWithCacheDir(e.h.CNIPath, t.TempDir(), nil)
			nobody := types.GCAttachment{ContainerID: "nobody-" + harness.RandomID(), IfName: "eth9"}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := gc.GCNetworkList(ctx, e.list("1.1.0"), &libcni.GCArgs{ValidAttachments: []types.GCAttachment{nobody}}); err != nil {
				t.Fatalf("meshwire GC: %v", err)
			}
			if v.nftables {
				// The reference's nftables portmap rules carry the
				// container id alone, no network: GC of one network cannot
				// tell them from another network's, so they go with DEL.
				for _, p := range []*upPod{a, b} {
					r := attachment.Reference{Network: e.name, ContainerID: p.att.RT.ContainerID, IfName: p.att.RT.IfName}
					for _, l := range e.refLines(t, p) {
						if !strings.Contains(l, `comment "`+r.ContainerID+`"`) || strings.Contains(l, r.MasqNftKey()) {
							t.Fatalf("after GC: the reference's rules of %s remain:\n%s", p.name, l)
						}
					}
					if err := p.att.Del(); err != nil {
						t.Fatal(err)
					}
				}
			}
			e.wantNoRefLines(t, "after meshwire's GC", a, b)
			e.meshwirePod(t, "C", portA)
			e.mustReach(t, portA, "C")
		})
	}
}

// sharedHostportLines reads, per iptables tool, the nat lines of the
// reference portmap's shared chains the host has now: the CNI-HOSTPORT-*
// chains, their rules and the jumps to them, as the tool saves them.
func sharedHostportLines(t *testing.T) map[string][]string {
	t.Helper()
	lines := map[string][]string{}
	for _, v := range []string{"nft", "legacy"} {
		for _, fam := range []string{"iptables", "ip6tables"} {
			tool := fam + "-" + v
			out, err := exec.Command(tool+"-save", "-t", "nat").Output()
			if err != nil {
				t.Fatalf("%s-save: %v", tool, err)
			}
			for _, l := range strings.Split(string(out), "\n") {
				if strings.HasPrefix(l, ":CNI-HOSTPORT-") || strings.HasPrefix(l, "-A ") && strings.Contains(l, "CNI-HOSTPORT-") {
					lines[tool] = append(lines[tool], l)
				}
			}
		}
	}
	return lines
}

// restoreSharedHostport puts back the shared lines the test's DEL or GC
// removed (chains first, then their rules and the jumps, in the order
// saved), and says what it put back.
func restoreSharedHostport(t *testing.T, before map[string][]string) {
	t.Helper()
	now := sharedHostportLines(t)
	for tool, lines := range before {
		have := map[string]bool{}
		for _, l := range now[tool] {
			have[l] = true
		}
		var chains, rules []string
		for _, l := range lines {
			switch {
			case have[l]:
			case strings.HasPrefix(l, ":"):
				chains = append(chains, strings.Fields(l)[0]+" - [0:0]")
			default:
				rules = append(rules, l)
			}
		}
		if len(chains)+len(rules) == 0 {
			continue
		}
		t.Logf("%s: the last reference attachment took the host's shared chains; restoring %d chains, %d rules", tool, len(chains), len(rules))
		if err := natRestore(tool, append(chains, rules...)...); err != nil {
			t.Errorf("restore the shared chains with %s: %v", tool, err)
		}
	}
}
