//go:build kernel

package istio

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/ruleset"
	"github.com/meshwire/meshwire/test/harness"
)

// ambientCase is one case of istio-cni's ambient rule tests
// (GetCommonInPodTestCases and GetCommonHostTestCases in
// cni/pkg/iptables/common_test.go), each run for IPv4 and with IPv6
// (Istio's EnableIPv6): the node's configuration and the pod's overrides.
type ambientCase struct {
	name        string
	redirectDNS bool
	pod         ambient.Overrides
	host        bool // the host rule, not the in-pod rules
}

var virtualInterfaces = []string{"fake1s0f0", "fake1s0f1"}

var ambientCases = []ambientCase{
	{name: "default", redirectDNS: true},
	{name: "ingress", pod: ambient.Overrides{Ingress: true}},
	{name: "virtual_interfaces", pod: ambient.Overrides{VirtualInterfaces: virtualInterfaces}},
	{name: "ingress_and_virtual_interfaces", pod: ambient.Overrides{Ingress: true, VirtualInterfaces: virtualInterfaces}},
	{name: "dns_pod_enabled_and_off_globally", pod: ambient.Overrides{DNS: ambient.DNSOn}},
	{name: "dns_pod_disabled_and_on_globally", redirectDNS: true, pod: ambient.Overrides{DNS: ambient.DNSOff}},
	{name: "hostprobe", redirectDNS: true, host: true},
}

// config is the case's configuration as Istio's tests build it
// (constructTestConfig): their probe addresses, IPv6 when ipv6. The
// iptables host test gives IPv6 probes istio's default address; the
// nftables host test finds kubelet's uid 1000.
func (c ambientCase) config(ipv6, nft bool) ambient.Config {
	cfg := ambient.Config{
		IPv6:        ipv6,
		RedirectDNS: c.redirectDNS,
		ProbeSNAT:   netip.MustParseAddr("169.254.7.127"),
		ProbeSNATv6: netip.MustParseAddr("e9ac:1e77:90ca:399f:4d6d:ece2:2f9b:3164"),
		KubeletUID:  1000,
	}
	if c.host && !nft {
		cfg.ProbeSNATv6 = ambient.DefaultProbeSNATv6
	}
	return cfg
}

// rules is meshwire's transaction of the case.
func (c ambientCase) rules(cfg ambient.Config, nft bool) *ruleset.Tx {
	switch {
	case c.host && nft:
		return ambient.HostNft(cfg)
	case c.host:
		return ambient.HostIPTables(cfg)
	case nft:
		return ambient.InPodNft(cfg, c.pod)
	}
	return ambient.InPodIPTables(cfg, c.pod)
}

func (c ambientCase) golden(dir string, ipv6 bool) string {
	name := c.name
	if ipv6 {
		name += "_ipv6"
	}
	return "cni/pkg/" + dir + "/testdata/" + name + ".golden"
}

// TestIstioAmbientGoldens: for every case of istio-cni's ambient rule
// tests, Istio's golden rules and meshwire's (package ambient, applied
// through the firewall), each loaded into a throwaway namespace and read
// back by the same tool, are the same: the iptables goldens on
// iptables-nft and iptables-legacy, the nftables goldens on native
// nftables. The host case also holds the probe sets (ipsets with
// iptables). And the comparison catches a difference: meshwire's rules
// less one never match.
func TestIstioAmbientGoldens(t *testing.T) {
	harness.RequireRoot(t)
	for _, b := range backends {
		for _, c := range ambientCases {
			for _, ipv6 := range []bool{false, true} {
				name := b.name + "/" + c.name
				if ipv6 {
					name += "_ipv6"
				}
				t.Run(name, func(t *testing.T) {
					h := harness.New(t)
					nft := b.variant == ""
					cfg := c.config(ipv6, nft)
					tx := c.rules(cfg, nft)
					var read func(*pod) string
					var istio *pod
					if nft {
						read, istio = ambientNft(t, h, c, ipv6)
					} else {
						read, istio = ambientIPTables(t, h, b, c, ipv6)
					}
					want := read(istio)
					if c.host && !strings.Contains(want, ambient.ProbeSetName(ruleset.V4)+" ") && !strings.Contains(want, ambient.ProbeSetName(ruleset.V4)+" {") {
						t.Fatalf("istio's side reads back without its probe set:\n%s", want)
					}

					got := read(ambientPod(t, h, b, c, cfg, tx))
					if got != want {
						t.Errorf("meshwire's rules differ from istio's golden:\n%s--- istio\n%s\n--- meshwire\n%s", diffLines(want, got), want, got)
					}
					less, dropped := withoutLastRule(tx)
					if mutated := read(ambientPod(t, h, b, c, cfg, less)); mutated == want {
						t.Errorf("without the last rule of its chain %s, meshwire's rules still read back as istio's golden", dropped)
					}
				})
			}
		}
	}
}

// ambientIPTables loads the case's iptables golden into a namespace (the
// host case's ipsets first, created with the ipset tool as istio-cni
// creates them: hash:ip, with comments) and returns it with the reader
// both sides are compared with: iptables-save of each family, and the
// ipsets.
func ambientIPTables(t *testing.T, h *harness.H, b backend, c ambientCase, ipv6 bool) (func(*pod) string, *pod) {
	golden, err := File(c.golden("iptables", ipv6))
	if err != nil {
		t.Fatal(err)
	}
	gv4, gv6 := SplitIPTablesGolden(string(golden))
	if gv4 == "" || (gv6 != "") != ipv6 {
		t.Fatalf("golden %s: IPv4 %d bytes, IPv6 %d bytes; the case has IPv6 %v", c.name, len(gv4), len(gv6), ipv6)
	}
	istio := newPod(h, captureCase{ipv6: ipv6})
	if c.host {
		istio.mustRun("ipset", "create", ambient.ProbeSetName(ruleset.V4), "hash:ip", "family", "inet", "comment")
		if ipv6 {
			istio.mustRun("ipset", "create", ambient.ProbeSetName(ruleset.V6), "hash:ip", "family", "inet6", "comment")
		}
	}
	for i, payload := range []string{gv4, gv6} {
		if payload == "" {
			continue
		}
		if _, err := istio.run(payload, nil, b.tool(i == 1, "restore"), "--noflush"); err != nil {
			t.Fatalf("load golden: %v\n%s", err, payload)
		}
	}
	read := func(p *pod) string {
		s := "# IPv4\n" + NormalizeSave(p.mustRun(b.tool(false, "save"))) +
			"\n# IPv6\n" + NormalizeSave(p.mustRun(b.tool(true, "save")))
		if c.host {
			s += "\n# ipsets\n" + ipsets(p.mustRun("ipset", "save"))
		}
		return s
	}
	return read, istio
}

// ambientNft loads the case's nftables golden into a namespace (the host
// case's sets first, declared as istio-cni's HostNftSetManager declares
// them, its comment aside) and returns it with the reader both sides are
// compared with: nft list ruleset.
func ambientNft(t *testing.T, h *harness.H, c ambientCase, ipv6 bool) (func(*pod) string, *pod) {
	golden, err := File(c.golden("nftables", ipv6))
	if err != nil {
		t.Fatal(err)
	}
	script := string(golden)
	if c.host {
		table := "inet " + ambient.NftTablePrefix + "nat"
		sets := fmt.Sprintf("add table %s\nadd set %s %s { type ipv4_addr; }\n", table, table, ambient.ProbeSetName(ruleset.V4))
		if ipv6 {
			sets += fmt.Sprintf("add set %s %s { type ipv6_addr; }\n", table, ambient.ProbeSetName(ruleset.V6))
		}
		script = sets + script
	}
	istio := newPod(h, captureCase{ipv6: ipv6})
	if out, err := istio.run(script, nil, "nft", "-f", "-"); err != nil {
		t.Fatalf("load golden: %v\n%s", err, out)
	}
	read := func(p *pod) string {
		s, _ := normalizeNft(p.mustRun("nft", "list", "ruleset"), false)
		return s
	}
	return read, istio
}

// ambientPod is a namespace with meshwire's rules of the case, tx,
// applied through the firewall of backend b (and, for the host case with
// iptables, the probe ipsets created).
func ambientPod(t *testing.T, h *harness.H, b backend, c ambientCase, cfg ambient.Config, tx *ruleset.Tx) *pod {
	t.Helper()
	p := newPod(h, captureCase{ipv6: cfg.IPv6})
	be := firewall.Backend{Kind: firewall.NFTables}
	if b.variant != "" {
		be = firewall.Backend{Kind: firewall.IPTables, Variant: firewall.Variant(b.variant)}
	}
	err := p.ns.Do(func() error {
		fw := firewall.New(be)
		defer fw.Close()
		if c.host && be.Kind == firewall.IPTables {
			// The probe ipsets, as ambient.Host declares them.
			sets := &ruleset.Tx{}
			for _, f := range cfg.Families() {
				sets.AddSet(ruleset.IPSets(f), ruleset.Set{Name: ambient.ProbeSetName(f), Family: f})
			}
			if err := fw.Apply(context.Background(), sets); err != nil {
				return err
			}
		}
		return fw.Apply(context.Background(), tx)
	})
	if err != nil {
		t.Fatalf("apply meshwire's rules (%s): %v", be, err)
	}
	return p
}

// withoutLastRule is tx less its last rule (a rule appended, or the last
// rule of a table written whole), and the chain it was in.
func withoutLastRule(tx *ruleset.Tx) (*ruleset.Tx, string) {
	ops := append([]ruleset.Op(nil), tx.Ops()...)
	for i := len(ops) - 1; i >= 0; i-- {
		o := ops[i]
		if o.Rule != nil {
			return (&ruleset.Tx{}).AppendOps(append(ops[:i:i], ops[i+1:]...)...), o.Rule.Chain
		}
		if o.Def == nil {
			continue
		}
		def := *o.Def
		def.Chains = append([]ruleset.Chain(nil), def.Chains...)
		for j := len(def.Chains) - 1; j >= 0; j-- {
			if n := len(def.Chains[j].Rules); n > 0 {
				def.Chains[j].Rules = def.Chains[j].Rules[:n-1]
				o.Def = &def
				ops[i] = o
				return (&ruleset.Tx{}).AppendOps(ops...), def.Chains[j].Name
			}
		}
	}
	return tx, ""
}

var ipsetCreate = regexp.MustCompile(`^create (\S+) (\S+) family (\S+) .*`)

// ipsets sums up `ipset save`: each set's name, type, family, and whether
// its elements carry comments (sizes and the hash seed left out).
func ipsets(save string) string {
	var out []string
	for _, line := range strings.Split(save, "\n") {
		m := ipsetCreate.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := strings.Join(m[1:], " ")
		if strings.Contains(line, " comment") {
			s += " comment"
		}
		out = append(out, s)
	}
	return strings.Join(out, "\n")
}
