// Package ambient is the rule model of Istio's ambient mode: the rules a
// node agent installs inside an enrolled pod's network namespace, which
// send the pod's traffic to ztunnel's listeners in that same namespace,
// and the node's one host rule that lets kubelet's probes through. It
// builds them as typed transactions (ruleset.Tx) for iptables (either
// variant) and native nftables, rule for rule what istio-cni programs
// (cni/pkg/iptables and cni/pkg/nftables, Istio 1.30): test/istio holds
// them to Istio's own golden files, case for case. Like package
// intercept, it is pure: the firewall (internal/firewall) applies what it
// builds; ProbeIPSets is its one kernel-touching function.
package ambient

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/meshwire/meshwire/internal/ruleset"
)

// The marks and ports ztunnel and the node agent agree on.
const (
	// Mark is on every packet ztunnel sends (1337), in the bits MarkMask.
	Mark     = 0x539
	MarkMask = 0xfff
	// ConnMark marks the connections ztunnel accepted, so that their
	// replies leave the pod without capture.
	ConnMark = 0x111

	OutboundPort         = 15001 // ztunnel's outbound capture
	InboundPlaintextPort = 15006 // ztunnel's inbound capture of plain TCP
	InboundPort          = 15008 // HBONE, reached without redirection
	DNSPort              = 15053 // ztunnel's DNS proxy
	DNSZone              = 1     // the conntrack zone of ztunnel's DNS packets

	// RouteTable and RulePriority are the in-pod policy routing of
	// ztunnel's accepted connections: "ip rule add fwmark
	// 0x111/0xfff pref 32764 lookup 100" and "ip route add local
	// 0.0.0.0/0 dev lo table 100", so that the app's replies to the
	// client addresses ztunnel connects from come back to ztunnel.
	RouteTable   = 100
	RulePriority = 32764

	// ProbeSet names the sets of the addresses of enrolled pods, one per
	// family (ProbeSet+"-v4", ProbeSet+"-v6"): ipsets with iptables, sets
	// of the host's nftables table with native nftables.
	ProbeSet = "istio-inpod-probes"
)

// Istio's default source addresses of the node's probes as pods see
// them (HOST_PROBE_SNAT_ADDRESS, HOST_PROBE_V6_SNAT_ADDRESS).
var (
	DefaultProbeSNAT   = netip.MustParseAddr("169.254.7.127")
	DefaultProbeSNATv6 = netip.MustParseAddr("fd16:9254:7127:1337:ffff:ffff:ffff:ffff")
)

// Config is the node's ambient configuration.
type Config struct {
	// IPv6 adds the IPv6 rules (Istio's EnableIPv6).
	IPv6 bool
	// RedirectDNS sends the pods' DNS to ztunnel unless a pod says
	// otherwise (Overrides.DNS).
	RedirectDNS bool
	// ProbeSNAT and ProbeSNATv6 are the addresses the host rule gives the
	// node's probes (DefaultProbeSNAT, DefaultProbeSNATv6), which the
	// in-pod rules let through.
	ProbeSNAT, ProbeSNATv6 netip.Addr
	// KubeletUID is the uid of kubelet, whose probes the host rule of
	// native nftables matches (iptables matches any local socket).
	KubeletUID uint32
}

// DNS is a pod's own choice of DNS capture.
type DNS int

const (
	DNSDefault DNS = iota // the node's (Config.RedirectDNS)
	DNSOn
	DNSOff
)

// Overrides is what one pod changes of the in-pod rules (Istio's
// PodLevelOverrides).
type Overrides struct {
	// Ingress leaves inbound traffic alone (a gateway's pod).
	Ingress bool
	// VirtualInterfaces are interfaces whose inbound TCP is the pod's
	// outbound (a VM's, KubeVirt's): sent to OutboundPort.
	VirtualInterfaces []string
	DNS               DNS
}

// Chain and table names: istio-cni's, so that people and tools that know
// them find their way.
const (
	ChainPrerouting  = "ISTIO_PRERT"
	ChainOutput      = "ISTIO_OUTPUT"
	ChainPostrouting = "ISTIO_POSTRT"

	// NftTablePrefix names the inet tables of native nftables, one per
	// iptables table: istio-ambient-nat, -mangle, -raw.
	NftTablePrefix = "istio-ambient-"
)

const (
	raw, mangle, nat = "raw", "mangle", "nat"
)

// tables are the iptables tables the in-pod rules use, in the order
// nftables gets theirs.
var tables = []string{nat, mangle, raw}

// entry is one rule of the in-pod rule set, in the iptables table it
// belongs to.
type entry struct {
	table string
	rule  ruleset.Rule
}

func rule(chain string, t ruleset.Target, m ...ruleset.Match) ruleset.Rule {
	return ruleset.Rule{Chain: chain, Match: m, Target: t}
}

func jump(chain string) ruleset.Target    { return ruleset.Target{Kind: ruleset.Jump, Chain: chain} }
func redirect(port uint16) ruleset.Target { return ruleset.Target{Kind: ruleset.Redirect, Port: port} }

var (
	accept = ruleset.Target{Kind: ruleset.Accept}
	ret    = ruleset.Target{Kind: ruleset.Return}
	zone   = ruleset.Target{Kind: ruleset.CTZone, Zone: DNSZone}
)

func proto(p string) ruleset.Match { return ruleset.Match{Kind: ruleset.MatchProto, Name: p} }
func port(kind ruleset.MatchKind, p string, n uint16, not bool) ruleset.Match {
	return ruleset.Match{Kind: kind, Name: p, Ports: []uint16{n}, Not: not}
}
func addr(kind ruleset.MatchKind, a netip.Addr, not bool) ruleset.Match {
	return ruleset.Match{Kind: kind, Prefix: netip.PrefixFrom(a, a.BitLen()), Host: true, Not: not}
}
func mark(not bool) ruleset.Match {
	return ruleset.Match{Kind: ruleset.MatchMark, Value: Mark, Mask: MarkMask, Not: not}
}

// loopback is the pod's loopback address of family f.
func loopback(f ruleset.IPVersion) netip.Addr {
	if f == ruleset.V6 {
		return netip.IPv6Loopback()
	}
	return netip.MustParseAddr("127.0.0.1")
}

// probeSNAT is the probes' source address of family f.
func (c Config) probeSNAT(f ruleset.IPVersion) netip.Addr {
	if f == ruleset.V6 {
		return c.ProbeSNATv6
	}
	return c.ProbeSNAT
}

// Families are the address families of the rules: IPv4, and IPv6 too
// with IPv6.
func (c Config) Families() []ruleset.IPVersion {
	if c.IPv6 {
		return []ruleset.IPVersion{ruleset.V4, ruleset.V6}
	}
	return []ruleset.IPVersion{ruleset.V4}
}

// inPod is the in-pod rule set in istio-cni's order (AppendInpodRules):
// a rule of Family 0 is of both families; a rule with an address is
// written once per family, IPv4's first. istio-nftables orders the
// matches of the two conntrack zone rules differently from
// istio-iptables (nft).
func inPod(cfg Config, pod Overrides, nft bool) []entry {
	var out []entry
	add := func(table string, r ruleset.Rule) { out = append(out, entry{table, r}) }
	// each adds the rule of each family, with that family's addresses.
	each := func(table string, r func(ruleset.IPVersion) ruleset.Rule) {
		for _, f := range cfg.Families() {
			fr := r(f)
			fr.Family = f
			add(table, fr)
		}
	}
	dns := pod.DNS == DNSOn || (pod.DNS == DNSDefault && cfg.RedirectDNS)
	tcp := proto("tcp")

	add(mangle, rule("PREROUTING", jump(ChainPrerouting)))
	add(mangle, rule("OUTPUT", jump(ChainOutput)))
	add(nat, rule("OUTPUT", jump(ChainOutput)))
	if dns {
		add(raw, rule("PREROUTING", jump(ChainPrerouting)))
		add(raw, rule("OUTPUT", jump(ChainOutput)))
	}
	add(nat, rule("PREROUTING", jump(ChainPrerouting)))

	// A virtual interface's inbound TCP is outbound: to ztunnel's
	// outbound port, and out of the chain.
	for _, ifc := range pod.VirtualInterfaces {
		in := ruleset.Match{Kind: ruleset.MatchIn, Name: ifc}
		add(nat, rule(ChainPrerouting, redirect(OutboundPort), in, tcp))
		add(nat, rule(ChainPrerouting, ret, in, tcp))
	}
	// ztunnel's packets mark their connection.
	add(mangle, rule(ChainPrerouting, ruleset.Target{Kind: ruleset.ConnmarkSet, Mark: ConnMark, Mask: MarkMask}, mark(false)))

	// The node's probes (the host rule gives them ProbeSNAT) and their
	// replies are not captured.
	tcpModule := ruleset.Match{Kind: ruleset.MatchProtoModule, Name: "tcp"}
	if !pod.Ingress {
		each(nat, func(f ruleset.IPVersion) ruleset.Rule {
			return rule(ChainPrerouting, accept, tcp, tcpModule, addr(ruleset.MatchSrc, cfg.probeSNAT(f), false))
		})
	}
	each(nat, func(f ruleset.IPVersion) ruleset.Rule {
		return rule(ChainOutput, accept, tcp, tcpModule, addr(ruleset.MatchDst, cfg.probeSNAT(f), false))
	})
	// Inbound TCP to ztunnel's inbound port, but HBONE's and ztunnel's own.
	if !pod.Ingress {
		each(nat, func(f ruleset.IPVersion) ruleset.Rule {
			return rule(ChainPrerouting, redirect(InboundPlaintextPort),
				addr(ruleset.MatchDst, loopback(f), true), tcp, port(ruleset.MatchDPort, "tcp", InboundPort, true), mark(true))
		})
	}
	// Outbound packets of ztunnel's connections get its mark back.
	connmark := ruleset.Match{Kind: ruleset.MatchConnMark, Value: ConnMark, Mask: MarkMask}
	add(mangle, rule(ChainOutput, ruleset.Target{Kind: ruleset.ConnmarkRestore}, connmark))

	if dns {
		// The pod's DNS to ztunnel's DNS proxy.
		add(nat, rule(ChainOutput, redirect(DNSPort),
			ruleset.Match{Kind: ruleset.MatchOut, Name: "lo", Not: true}, mark(true), proto("udp"), port(ruleset.MatchDPort, "udp", 53, false)))
		each(nat, func(f ruleset.IPVersion) ruleset.Rule {
			return rule(ChainOutput, redirect(DNSPort),
				addr(ruleset.MatchDst, loopback(f), true), tcp, port(ruleset.MatchDPort, "tcp", 53, false), mark(true))
		})
		// ztunnel's DNS queries and their answers in a conntrack zone of
		// their own, so that they never clash with the pod's.
		udp, query, answer := proto("udp"), port(ruleset.MatchDPort, "udp", 53, false), port(ruleset.MatchSPort, "udp", 53, false)
		if nft {
			add(raw, rule(ChainOutput, zone, udp, query, mark(false)))
			add(raw, rule(ChainPrerouting, zone, udp, answer, mark(true)))
		} else {
			add(raw, rule(ChainOutput, zone, udp, mark(false), query))
			add(raw, rule(ChainPrerouting, zone, udp, mark(true), answer))
		}
	}

	// Packets of ztunnel's accepted connections go out as they are.
	add(nat, rule(ChainOutput, accept, tcp, ruleset.Match{Kind: ruleset.MatchMark, Value: ConnMark, Mask: MarkMask}))
	// The pod calling itself over loopback.
	each(nat, func(f ruleset.IPVersion) ruleset.Rule {
		return rule(ChainOutput, accept, ruleset.Match{Kind: ruleset.MatchOut, Name: "lo"}, addr(ruleset.MatchDst, loopback(f), true))
	})
	// Every other outbound TCP to ztunnel's outbound port.
	each(nat, func(f ruleset.IPVersion) ruleset.Rule {
		return rule(ChainOutput, redirect(OutboundPort), tcp, addr(ruleset.MatchDst, loopback(f), true), mark(true))
	})
	return out
}

// InPodIPTables is the transaction that installs the in-pod rules in a
// pod's namespace with iptables (either variant): for each family, each
// table's chains (declared, so emptied when there) and rules, in
// istio-cni's order.
func InPodIPTables(cfg Config, pod Overrides) *ruleset.Tx {
	entries := inPod(cfg, pod, false)
	tx := &ruleset.Tx{}
	for _, f := range cfg.Families() {
		for _, table := range []string{mangle, nat, raw} {
			id := ruleset.TableID{Family: f.Tables(), Name: table}
			var rules []ruleset.Rule
			var chains, jumped []string
			for _, e := range entries {
				if e.table != table || (e.rule.Family != 0 && e.rule.Family != f) {
					continue
				}
				r := e.rule
				r.Family = f
				rules = append(rules, r)
				if !ruleset.IsBuiltin(r.Chain) && !slices.Contains(chains, r.Chain) {
					chains = append(chains, r.Chain)
				}
				if r.Target.Kind == ruleset.Jump {
					jumped = append(jumped, r.Target.Chain)
				}
			}
			// Chains declared in order of their first rule, then those
			// only jumped to, as istio-cni's restore input has them.
			for _, c := range jumped {
				if !slices.Contains(chains, c) {
					chains = append(chains, c)
				}
			}
			for _, c := range chains {
				tx.AddChain(id, ruleset.Chain{Name: c})
			}
			for _, r := range rules {
				tx.AddRule(id, r)
			}
		}
	}
	return tx
}

// InPodNft is the transaction that installs the in-pod rules in a pod's
// namespace with native nftables: istio-nftables' inet tables
// (istio-ambient-nat, -mangle, -raw), each replaced whole, and removed
// when the pod needs none of its rules.
func InPodNft(cfg Config, pod Overrides) *ruleset.Tx {
	entries := inPod(cfg, pod, true)
	tx := &ruleset.Tx{}
	for _, table := range tables {
		id := ruleset.TableID{Family: ruleset.Inet, Name: NftTablePrefix + table}
		tx.DestroyTable(id)
		def := ruleset.Table{Family: id.Family, Name: id.Name}
		for _, name := range []string{"PREROUTING", "OUTPUT", ChainPrerouting, ChainOutput} {
			c := ruleset.Chain{Name: nftChain(name)}
			if base, ok := ruleset.IPTablesHook(table, name); ok {
				c.Base = &base
			}
			used := false
			for _, e := range entries {
				if e.table != table {
					continue
				}
				used = used || e.rule.Target.Chain == name
				if e.rule.Chain == name {
					r := e.rule
					// istio-nftables counts every rule but the jumps.
					r.Chain, r.Counter = c.Name, r.Target.Kind != ruleset.Jump
					if r.Target.Kind == ruleset.Jump {
						r.Target.Chain = nftChain(r.Target.Chain)
					}
					c.Rules = append(c.Rules, r)
				}
			}
			if used || len(c.Rules) > 0 {
				def.Chains = append(def.Chains, c)
			}
		}
		if len(def.Chains) > 0 {
			tx.AddTable(def)
		}
	}
	return tx
}

// InPod is the in-pod rules of a pod with overrides ov, with native
// nftables or iptables: what they own (replaced and removed whole
// through the firewall: InPodOwned), and the transaction that writes
// them (InPodNft, InPodIPTables).
func InPod(cfg Config, ov Overrides, native bool) (ruleset.Owned, *ruleset.Tx) {
	if native {
		return InPodOwned(cfg, native), InPodNft(cfg, ov)
	}
	return InPodOwned(cfg, native), InPodIPTables(cfg, ov)
}

// InPodOwned is what the in-pod rules own in a pod's namespace: the inet
// tables istio-ambient-nat, -mangle and -raw with native nftables; with
// iptables, ISTIO_PRERT and ISTIO_OUTPUT in mangle, nat and raw, jumped to
// from PREROUTING and OUTPUT.
func InPodOwned(cfg Config, native bool) ruleset.Owned {
	var o ruleset.Owned
	if native {
		for _, t := range tables {
			o.Tables = append(o.Tables, ruleset.TableID{Family: ruleset.Inet, Name: NftTablePrefix + t})
		}
		return o
	}
	for _, f := range cfg.Families() {
		for _, t := range []string{mangle, nat, raw} {
			o.Chains = append(o.Chains, ruleset.OwnedChains{Table: ruleset.TableID{Family: f.Tables(), Name: t},
				Builtins: []string{"PREROUTING", "OUTPUT"}, Chains: []string{ChainPrerouting, ChainOutput}})
		}
	}
	return o
}

// nftChain is istio-nftables' name of a chain: prerouting, output,
// istio-prerouting, istio-output, postrouting.
func nftChain(name string) string {
	switch name {
	case ChainPrerouting:
		return "istio-prerouting"
	case ChainOutput:
		return "istio-output"
	}
	return strings.ToLower(name)
}
