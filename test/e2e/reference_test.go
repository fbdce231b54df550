//go:build kernel

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/test/harness"
)

// Addresses and names of the reference parity tests: 198.18.160.0/20 and
// fd30:160::/48, bridges mwt-rp*, meshwire's host veths mwtr*.
//
// These tests run the reference plugins (harness.ReferenceVersion, built
// from the Go module proxy) and meshwire's side by side on the same config
// and compare what the kernel ends up with: whatever meshwire does
// differently on purpose is listed in docs/reference-differences.md;
// everything else must match.

// parityImpl is one implementation's harness: meshwire's binaries or the
// reference's, each with its own libcni cache and IPAM store.
type parityImpl struct {
	name    string
	h       *harness.H
	dataDir string
	ptpType string // the type of the point-to-point plugin: "ptp" or meshwire's "veth"
}

func parityImpls(t *testing.T) []parityImpl {
	t.Helper()
	refDir := harness.ReferenceBinDir(t)
	h := harness.New(t)
	nodeBaseline(t)
	h.CheckNoLeaks()
	ref := *h
	ref.CNIPath = []string{refDir}
	ref.CacheDir = t.TempDir()
	ref.CNI = libcni.NewCNIConfigWithCacheDir(ref.CNIPath, ref.CacheDir, nil)
	return []parityImpl{
		{name: "reference " + harness.ReferenceVersion, h: &ref, dataDir: t.TempDir(), ptpType: "ptp"},
		{name: "meshwire", h: h, dataDir: t.TempDir(), ptpType: "veth"},
	}
}

// parityCase is one config run by both implementations.
type parityCase struct {
	name string
	// plugin renders the plugin config for an implementation.
	plugin func(p parityImpl, br string) map[string]any
	// prepare runs before ADD: on the pod's namespace, and on the bridge
	// name (both implementations get a fresh bridge of that name).
	prepare func(t *testing.T, ns *harness.NS, br string)
	// deliberate are facts where meshwire differs on purpose (the table in
	// docs/reference-differences.md says why), with meshwire's value.
	deliberate map[string]string
}

func parityIPAM(p parityImpl, subnets ...string) map[string]any {
	var ranges [][]map[string]string
	for _, s := range subnets {
		ranges = append(ranges, []map[string]string{{"subnet": s}})
	}
	return map[string]any{"type": "host-local", "dataDir": p.dataDir, "ranges": ranges,
		"routes": []map[string]string{{"dst": "0.0.0.0/0"}, {"dst": "::/0"}}}
}

// ipv6Off makes the pod's namespace one whose runtime turned IPv6 off: lo
// and every interface created later (the default) have disable_ipv6 set.
func ipv6Off(t *testing.T, ns *harness.NS, _ string) {
	t.Helper()
	err := ns.Do(func() error {
		for _, dev := range []string{"default", "lo"} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+dev+"/disable_ipv6", []byte("1"), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("turn IPv6 off in %s: %v", ns.Name, err)
	}
}

// foreignBridge creates the bridge as an administrator (or another tool)
// would: up, its MAC not pinned, router advertisements accepted.
func foreignBridge(t *testing.T, _ *harness.NS, br string) {
	t.Helper()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = br
	b := &netlink.Bridge{LinkAttrs: attrs}
	if err := netlink.LinkAdd(b); err != nil {
		t.Fatalf("create bridge %s: %v", br, err)
	}
	if err := netlink.LinkSetUp(b); err != nil {
		t.Fatal(err)
	}
}

// parityFacts is what the kernel shows of one attachment, in terms that do
// not depend on the implementation (no names, MACs or addresses).
func parityFacts(t *testing.T, ns *harness.NS, res *current.Result, br string) map[string]string {
	t.Helper()
	f := map[string]string{}
	for _, k := range []string{
		"net/ipv4/conf/eth0/arp_notify",
		"net/ipv6/conf/eth0/accept_dad",
		"net/ipv6/conf/eth0/enhanced_dad",
		"net/ipv6/conf/eth0/keep_addr_on_down",
		"net/ipv6/conf/eth0/disable_ipv6",
		"net/ipv6/conf/lo/disable_ipv6",
	} {
		f["pod "+k] = ns.Sysctl(k)
	}
	fams := map[string]bool{}
	for _, a := range ns.Addrs("eth0") {
		if strings.Contains(a, ".") {
			fams["IPv4"] = true
		} else if !strings.HasPrefix(a, "fe80:") {
			fams["IPv6"] = true
		}
	}
	f["pod address families"] = fmt.Sprint(fams)
	hostSysctl := func(key string) string {
		b, err := os.ReadFile(filepath.Join("/proc/sys", key))
		if err != nil {
			return "unreadable"
		}
		return strings.TrimSpace(string(b))
	}
	podIPs := map[string]bool{}
	for _, ip := range res.IPs {
		podIPs[ip.Address.IP.String()] = true
	}
	for _, intf := range res.Interfaces {
		if intf.Sandbox != "" {
			continue
		}
		if intf.Name == br {
			f["bridge accept_ra"] = hostSysctl("net/ipv6/conf/" + br + "/accept_ra")
			b, err := os.ReadFile("/sys/class/net/" + br + "/addr_assign_type")
			if err != nil {
				t.Fatal(err)
			}
			f["bridge addr_assign_type"] = strings.TrimSpace(string(b))
			continue
		}
		f["host veth accept_ra"] = hostSysctl("net/ipv6/conf/" + intf.Name + "/accept_ra")
		l, err := netlink.LinkByName(intf.Name)
		if err != nil {
			t.Fatalf("host end %s: %v", intf.Name, err)
		}
		routes, err := netlink.RouteList(l, netlink.FAMILY_ALL)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range routes {
			if r.Dst != nil && podIPs[r.Dst.IP.String()] {
				fam := "IPv4"
				if r.Dst.IP.To4() == nil {
					fam = "IPv6"
				}
				f["host route to the pod ("+fam+")"] = fmt.Sprintf("scope %s, gateway %v", r.Scope, r.Gw)
			}
		}
	}
	return f
}

// TestReferenceParityKernelState: the sysctls, routes and bridge settings
// the reference bridge and ptp plugins leave in the pod's namespace and on
// the host, meshwire leaves too (a namespace with IPv6 off gets its IPv6
// address; a bridge someone else made gets accept_ra off and its MAC
// pinned when it becomes the gateway).
func TestReferenceParityKernelState(t *testing.T) {
	impls := parityImpls(t)
	bridge := func(extra map[string]any) func(parityImpl, string) map[string]any {
		return func(p parityImpl, br string) map[string]any {
			c := map[string]any{"type": "bridge", "bridge": br, "isGateway": true, "hostVethPrefix": "mwtr",
				"ipam": parityIPAM(p, "198.18.160.0/24", "fd30:160::/64")}
			for k, v := range extra {
				c[k] = v
			}
			return c
		}
	}
	ptp := func(p parityImpl, _ string) map[string]any {
		return map[string]any{"type": p.ptpType, "hostVethPrefix": "mwtr", "mtu": 1400,
			"ipam": parityIPAM(p, "198.18.161.0/24", "fd30:161::/64")}
	}
	for _, tc := range []parityCase{
		{name: "bridge dual stack", plugin: bridge(nil)},
		{name: "bridge enabledad", plugin: bridge(map[string]any{"enabledad": true})},
		{name: "bridge layer 2", plugin: func(p parityImpl, br string) map[string]any {
			return map[string]any{"type": "bridge", "bridge": br, "hostVethPrefix": "mwtr"}
		}, deliberate: map[string]string{"bridge addr_assign_type": "3"}}, // every bridge meshwire creates has its MAC pinned
		{name: "bridge into a namespace with IPv6 off", plugin: bridge(nil), prepare: ipv6Off},
		{name: "bridge made by someone else", plugin: bridge(nil), prepare: foreignBridge},
		{name: "ptp dual stack", plugin: ptp},
		{name: "ptp into a namespace with IPv6 off", plugin: ptp, prepare: ipv6Off},
	} {
		t.Run(tc.name, func(t *testing.T) {
			br := "mwt-rp" + harness.RandomID()[:4]
			t.Cleanup(func() { bridgeRemoveLinks(br) })
			facts := map[string]map[string]string{}
			for i, p := range impls {
				bridgeRemoveLinks(br)
				ns := p.h.NewNS("rp")
				if tc.prepare != nil {
					tc.prepare(t, ns, br)
				}
				plugin, err := json.Marshal(tc.plugin(p, br))
				if err != nil {
					t.Fatal(err)
				}
				list := p.h.Single("1.0.0", fmt.Sprintf("mwt-rp%d", i), string(plugin))
				a := p.h.Attach(list, ns, "eth0", nil)
				res, err := a.Add()
				if err != nil {
					t.Fatalf("%s: ADD: %v", p.name, err)
				}
				cr, err := current.NewResultFromResult(res)
				if err != nil {
					t.Fatal(err)
				}
				facts[p.name] = parityFacts(t, ns, cr, br)
				if err := a.Del(); err != nil {
					t.Fatalf("%s: DEL: %v", p.name, err)
				}
			}
			for k, want := range tc.deliberate {
				if got := facts["meshwire"][k]; got != want {
					t.Errorf("meshwire: %s is %s, want %s", k, got, want)
				}
				delete(facts["meshwire"], k)
				delete(facts[impls[0].name], k)
			}
			if d := factsDiff(facts[impls[0].name], facts[impls[1].name]); d != "" {
				t.Fatalf("%s and %s differ (key: reference / meshwire):\n%s", impls[0].name, impls[1].name, d)
			}
		})
	}
}

// factsDiff lists the keys whose values differ, one per line.
func factsDiff(ref, mw map[string]string) string {
	keys := map[string]bool{}
	for k := range ref {
		keys[k] = true
	}
	for k := range mw {
		keys[k] = true
	}
	var out []string
	for k := range keys {
		r, okr := ref[k]
		m, okm := mw[k]
		if !okr {
			r = "(none)"
		}
		if !okm {
			m = "(none)"
		}
		if r != m {
			out = append(out, fmt.Sprintf("  %s: %s / %s", k, r, m))
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}
