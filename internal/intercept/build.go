package intercept

import (
	"net/netip"
	"slices"

	"github.com/meshwire/meshwire/internal/ruleset"
)

// TableRules is what one table holds: its user chains, in the order they
// are declared, and every rule, chain by chain in their final order.
type TableRules struct {
	Name   string
	Chains []string
	Rules  []ruleset.Rule
}

// RuleSet is the rule set of one iptables address family (Family V4 or
// V6), or the native nftables rule set of both (Family 0, see BuildNft).
type RuleSet struct {
	Family Family
	Tables []*TableRules // only those with rules
}

// Table returns the named table's rules, or nil.
func (rs *RuleSet) Table(name string) *TableRules {
	for _, t := range rs.Tables {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// Empty reports whether the rule set holds no rule at all.
func (rs *RuleSet) Empty() bool {
	for _, t := range rs.Tables {
		if len(t.Rules) > 0 {
			return false
		}
	}
	return true
}

// Build renders cfg into the iptables rule set of family f: rule for rule,
// chain for chain, what istio-iptables programs for the same flags
// (tools/istio-iptables/pkg/capture/run.go, Istio 1.30), so that both
// capture exactly the same traffic. A test compares the two on Istio's own
// golden files.
func Build(cfg Config, f Family) *RuleSet {
	b := &builder{cfg: cfg, ipv6: f == V6}
	b.run()
	return b.iptables(f)
}

// BuildNft renders cfg into the native nftables rule set that
// istio-nftables programs for the same flags
// (tools/istio-nftables/pkg/capture/run.go): the inet tables of NftTables,
// IPv6 rules included when ipv6 is set.
func BuildNft(cfg Config, ipv6 bool) *RuleSet {
	b := &builder{cfg: cfg, ipv6: ipv6, nft: true}
	b.run()
	return b.nftables()
}

// op is one step of istio's rule builder: append a rule to its chain, or
// insert it at a position (0 is the chain's head).
type op struct {
	table  string
	rule   ruleset.Rule
	insert bool
	pos    int
}

// builder replays istio's Run(): each step appends (or inserts) rules in
// istio's order; iptables and nftables then lay them out as their istio
// counterpart does.
type builder struct {
	cfg  Config
	ipv6 bool // istio's EnableIPv6
	nft  bool // istio-nftables' variant of the steps
	ops  []op
}

func (b *builder) add(table string, r ruleset.Rule) { b.ops = append(b.ops, op{table: table, rule: r}) }

// add4 and add6 append a rule of one family; IPv6 ones only with IPv6.
func (b *builder) add4(table string, r ruleset.Rule) { r.Family = V4; b.add(table, r) }
func (b *builder) add6(table string, r ruleset.Rule) {
	if b.ipv6 {
		r.Family = V6
		b.add(table, r)
	}
}

// addBoth appends a rule for each family, with the family's own value
// (istio's AppendVersionedRule): rule(V4), then rule(V6).
func (b *builder) addBoth(table string, rule func(Family) ruleset.Rule) {
	b.add4(table, rule(V4))
	b.add6(table, rule(V6))
}

func (b *builder) insert(table string, pos int, r ruleset.Rule) {
	b.ops = append(b.ops, op{table: table, rule: r, insert: true, pos: pos})
}

func (b *builder) insert4(table string, pos int, r ruleset.Rule) {
	r.Family = V4
	b.insert(table, pos, r)
}
func (b *builder) insert6(table string, pos int, r ruleset.Rule) {
	if b.ipv6 {
		r.Family = V6
		b.insert(table, pos, r)
	}
}

// lo is the pod's loopback range of family f (istio's
// HostIPv4LoopbackCidr, or ::1/128).
func (b *builder) lo(f Family) netip.Prefix { return b.cfg.loopback(f) }

// run is istio-iptables' Run(), step for step; where istio-nftables differs
// (b.nft), the step says so.
func (b *builder) run() {
	cfg := b.cfg
	redirectDNS := cfg.RedirectDNS && (cfg.CaptureAllDNS || len(cfg.DNSServers) > 0)

	b.excludeInterfaces()
	for _, ifc := range cfg.KubeVirtInterfaces {
		b.insert(NAT, 0, rule("PREROUTING", ret(), in(ifc)))
	}
	if cfg.DropInvalid {
		if b.nft {
			b.add(Mangle, rule("PREROUTING", jump(ChainDrop), proto("tcp"), ctstate("INVALID")))
		} else {
			b.add(Mangle, rule("PREROUTING", jump(ChainDrop), ctstate("INVALID")))
		}
		b.add(Mangle, rule(ChainDrop, ruleset.Target{Kind: ruleset.Drop}))
	}
	if b.vmTProxy() {
		// Not istio's (see vmTProxy): a VM's outbound connections skip
		// mangle's inbound capture, as they skip nat's.
		for _, ifc := range cfg.KubeVirtInterfaces {
			b.add(Mangle, rule("PREROUTING", ret(), in(ifc)))
		}
	}
	if cfg.InboundTunnelPort != 0 {
		b.add(NAT, rule(ChainInbound, ret(), proto("tcp"), dport("tcp", cfg.InboundTunnelPort)))
	}
	b.add(NAT, rule(ChainRedirect, redirect(cfg.ProxyPort), proto("tcp")))
	b.add(NAT, rule(ChainInRedirect, redirect(cfg.InboundCapturePort), proto("tcp")))
	b.inbound()

	b.add(NAT, rule("OUTPUT", jump(ChainOutput)))
	for _, p := range cfg.OutboundPortsExclude {
		b.add(NAT, rule(ChainOutput, ret(), dport("tcp", p)))
		b.add(NAT, rule(ChainOutput, ret(), dport("udp", p)))
	}
	b.addBoth(NAT, func(f Family) ruleset.Rule {
		return rule(ChainOutput, ret(), out("lo"), src(single(PassthroughSource(f))))
	})
	for _, o := range owners(cfg) {
		b.proxyOwner(o, redirectDNS)
	}
	b.ownerGroups()
	if redirectDNS {
		b.dns()
	}
	b.addBoth(NAT, func(f Family) ruleset.Rule { return rule(ChainOutput, ret(), dst(b.lo(f))) })
	for _, f := range []Family{V4, V6} {
		for _, p := range prefixesOf(f, cfg.OutboundCIDRsExclude) {
			b.addFamily(f, NAT, rule(ChainOutput, ret(), dst(p)))
		}
	}
	for _, p := range cfg.OutboundPorts {
		b.add(NAT, rule(ChainOutput, jump(ChainRedirect), dport("tcp", p)))
	}
	b.outboundInclude()
	if cfg.Mode == ModeTProxy {
		b.tproxyMarks()
	}
}

func (b *builder) addFamily(f Family, table string, r ruleset.Rule) {
	if f == V4 {
		b.add4(table, r)
	} else {
		b.add6(table, r)
	}
}

// excludeInterfaces leaves the excluded interfaces alone entirely
// (istio's shortCircuitExcludeInterfaces).
func (b *builder) excludeInterfaces() {
	for _, ifc := range b.cfg.ExcludeInterfaces {
		b.add(NAT, rule("PREROUTING", ret(), in(ifc)))
		b.add(NAT, rule("OUTPUT", ret(), out(ifc)))
	}
	if b.cfg.Mode == ModeTProxy {
		for _, ifc := range b.cfg.ExcludeInterfaces {
			b.add(Mangle, rule("PREROUTING", ret(), in(ifc)))
			b.add(Mangle, rule("OUTPUT", ret(), out(ifc)))
		}
	}
}

// vmTProxy reports whether the pod forwards a VM's traffic (kube-virt
// interfaces) with TPROXY inbound capture: there meshwire departs from
// istio-iptables, whose mangle rules divert the VM's outbound connections
// to the inbound port and the replies to the connections it forwards to
// lo, so that a VM behind a TPROXY pod reaches nothing but what the proxy
// captures (docs/reference-differences.md). Istio's goldens have no such
// case; every other rule set is istio's.
func (b *builder) vmTProxy() bool {
	return b.cfg.Mode == ModeTProxy && !b.cfg.InboundPorts.Empty() && len(b.cfg.KubeVirtInterfaces) > 0
}

// inbound captures the inbound ports (istio's handleInboundPortsInclude):
// REDIRECT to the inbound capture port, or with TPROXY a mark and a divert
// to it.
func (b *builder) inbound() {
	cfg := b.cfg
	if cfg.InboundPorts.Empty() {
		return
	}
	table := NAT
	if cfg.Mode == ModeTProxy {
		table = Mangle
		b.add(Mangle, rule(ChainDivert, ruleset.Target{Kind: ruleset.SetMark, Mark: cfg.TProxyMark}))
		b.add(Mangle, rule(ChainDivert, ruleset.Target{Kind: ruleset.Accept}))
		b.addBoth(Mangle, func(f Family) ruleset.Rule {
			return rule(ChainTProxy, ruleset.Target{Kind: ruleset.TProxy, Port: cfg.InboundCapturePort, Mark: cfg.TProxyMark}, proto("tcp"), notDst(b.lo(f)))
		})
	}
	b.add(table, rule("PREROUTING", jump(ChainInbound), proto("tcp")))
	if b.vmTProxy() {
		// Not istio's (see vmTProxy): replies to the connections the pod
		// forwards for a VM are routed on to the VM, not diverted to lo.
		b.add(Mangle, rule(ChainInbound, ret(), proto("tcp"), ctstate("RELATED,ESTABLISHED"), ruleset.Match{Kind: ruleset.MatchCTDir, Name: "REPLY"}))
	}
	if cfg.InboundPorts.All {
		for _, p := range cfg.InboundPortsExclude {
			b.add(table, rule(ChainInbound, ret(), proto("tcp"), dport("tcp", p)))
		}
		if cfg.Mode == ModeTProxy {
			b.add(Mangle, rule(ChainInbound, jump(ChainDivert), proto("tcp"), ctstate("RELATED,ESTABLISHED")))
			b.add(Mangle, rule(ChainInbound, jump(ChainTProxy), proto("tcp")))
		} else {
			b.add(NAT, rule(ChainInbound, jump(ChainInRedirect), proto("tcp")))
		}
		return
	}
	for _, p := range cfg.InboundPorts.Ports {
		if cfg.Mode == ModeTProxy {
			if b.nft {
				b.add(Mangle, rule(ChainInbound, jump(ChainDivert), proto("tcp"), ctstate("RELATED,ESTABLISHED"), dport("tcp", p)))
			} else {
				b.add(Mangle, rule(ChainInbound, jump(ChainDivert), proto("tcp"), dport("tcp", p), ctstate("RELATED,ESTABLISHED")))
			}
			b.add(Mangle, rule(ChainInbound, jump(ChainTProxy), proto("tcp"), dport("tcp", p)))
		} else {
			b.add(NAT, rule(ChainInbound, jump(ChainInRedirect), proto("tcp"), dport("tcp", p)))
		}
	}
}

// proxyOwner: the proxy calling the pod's own address (a service VIP that
// resolved to this pod) goes through the inbound side; other loopback
// traffic is left alone; none of the proxy's other connections is
// captured. With DNS capture, loopback DNS over TCP is not left alone
// (the uid rule also keeps the proxy's own DNS out of the inbound side).
func (b *builder) proxyOwner(o Owner, redirectDNS bool) {
	cfg := b.cfg
	self := []uint16{}
	if redirectDNS && !o.GID {
		self = append(self, 53)
	}
	if cfg.InboundTunnelPort != 0 {
		self = append(self, cfg.InboundTunnelPort)
	}
	b.addBoth(NAT, func(f Family) ruleset.Rule {
		m := []ruleset.Match{out("lo"), proto("tcp"), notDst(b.lo(f))}
		if len(self) > 0 {
			m = append(m, notDport("tcp", self...))
		}
		return rule(ChainOutput, jump(ChainInRedirect), append(m, owner(o))...)
	})
	if !cfg.includesLoopback() {
		if redirectDNS {
			b.add(NAT, rule(ChainOutput, ret(), out("lo"), proto("tcp"), notDport("tcp", 53), notOwner(o)))
		} else {
			b.add(NAT, rule(ChainOutput, ret(), out("lo"), notOwner(o)))
		}
	}
	b.add(NAT, rule(ChainOutput, ret(), owner(o)))
}

// ownerGroups leaves alone the connections the owner group filter does
// not capture (istio's handleCaptureByOwnerGroup): one RETURN per
// excluded group, or one RETURN for sockets of none of the groups
// captured.
func (b *builder) ownerGroups() {
	g := b.cfg.OutboundGroups
	if !g.Only {
		for _, gid := range g.GIDs {
			b.add(NAT, rule(ChainOutput, ret(), owner(Owner{ID: gid, GID: true})))
		}
		return
	}
	var noneOf []ruleset.Match
	for _, gid := range g.GIDs {
		noneOf = append(noneOf, notOwner(Owner{ID: gid, GID: true}))
	}
	b.add(NAT, rule(ChainOutput, ret(), noneOf...))
}

// dns sends DNS (TCP and UDP port 53) to the proxy's DNS port, with
// conntrack zones keeping the proxy's upstream queries apart from the
// app's (istio's SetupDNSRedir and addDNSConntrackZones).
func (b *builder) dns() {
	cfg := b.cfg
	v4, v6 := b.dnsServers(V4), b.dnsServers(V6)
	b.add(Raw, rule("OUTPUT", jump(ChainOutputDNS)))
	if b.nft {
		b.add(NAT, rule(ChainOutput, jump(ChainOutputDNS)))
	} else {
		if cfg.CaptureAllDNS || len(v4) > 0 {
			b.add4(NAT, rule(ChainOutput, jump(ChainOutputDNS)))
		}
		if cfg.CaptureAllDNS || len(v6) > 0 {
			b.add6(NAT, rule(ChainOutput, jump(ChainOutputDNS)))
		}
	}
	for _, p := range []string{"tcp", "udp"} {
		if cfg.CaptureAllDNS {
			// istio-nftables writes "meta l4proto tcp" before the TCP
			// port only (a port match alone implies its protocol, and
			// IPTables renders -p for it).
			m := []ruleset.Match{dport(p, 53)}
			if p == "tcp" {
				m = append([]ruleset.Match{proto("tcp")}, m...)
			}
			b.add(NAT, rule(ChainOutputDNS, redirect(DNSCapturePort), m...))
			continue
		}
		for _, s := range v4 {
			b.add4(NAT, rule(ChainOutputDNS, redirect(DNSCapturePort), dst(single(s)), dport(p, 53)))
		}
		for _, s := range v6 {
			b.add6(NAT, rule(ChainOutputDNS, redirect(DNSCapturePort), dst(single(s)), dport(p, 53)))
		}
	}
	for _, o := range owners(cfg) {
		b.add(Raw, rule(ChainOutputDNS, zone(1), dport("udp", 53), owner(o)))
		b.add(Raw, rule(ChainOutputDNS, zone(2), sport("udp", DNSCapturePort), owner(o)))
	}
	if cfg.CaptureAllDNS {
		b.add(Raw, rule("PREROUTING", jump(ChainInbound)))
		b.add(Raw, rule(ChainOutputDNS, zone(2), dport("udp", 53)))
		b.add(Raw, rule(ChainInbound, zone(1), sport("udp", 53)))
		return
	}
	if b.nft && len(v4)+len(v6) > 0 {
		b.add(Raw, rule("PREROUTING", jump(ChainInbound)))
	}
	for _, f := range []Family{V4, V6} {
		servers := v4
		if f == V6 {
			servers = v6
		}
		if !b.nft && len(servers) > 0 {
			b.addFamily(f, Raw, rule("PREROUTING", jump(ChainInbound)))
		}
		for _, s := range servers {
			b.addFamily(f, Raw, rule(ChainOutputDNS, zone(2), dport("udp", 53), dst(single(s))))
			b.addFamily(f, Raw, rule(ChainInbound, zone(1), sport("udp", 53), src(single(s))))
		}
	}
}

// dnsServers are the configured DNS servers of family f.
func (b *builder) dnsServers(f Family) []netip.Addr {
	var out []netip.Addr
	for _, s := range b.cfg.DNSServers {
		if hasAddr(f, s) {
			out = append(out, s)
		}
	}
	return out
}

// outboundInclude captures the included destinations, and sends what
// arrives on a kube-virt interface for them to the outbound port (istio's
// handleOutboundIncludeRules, IPv4 then IPv6; istio-nftables does both at
// once).
func (b *builder) outboundInclude() {
	cfg := b.cfg
	if cfg.OutboundCIDRs.All {
		if b.nft {
			b.add(NAT, rule(ChainOutput, jump(ChainRedirect)))
			for _, ifc := range cfg.KubeVirtInterfaces {
				b.insert(NAT, 0, rule("PREROUTING", jump(ChainRedirect), in(ifc)))
			}
			return
		}
		for _, f := range []Family{V4, V6} {
			b.addFamily(f, NAT, rule(ChainOutput, jump(ChainRedirect)))
			for _, ifc := range cfg.KubeVirtInterfaces {
				if f == V4 {
					b.insert4(NAT, 0, rule("PREROUTING", jump(ChainRedirect), in(ifc)))
				} else {
					b.insert6(NAT, 0, rule("PREROUTING", jump(ChainRedirect), in(ifc)))
				}
			}
		}
		return
	}
	for _, f := range []Family{V4, V6} {
		for _, p := range prefixesOf(f, cfg.OutboundCIDRs.Prefixes) {
			for _, ifc := range cfg.KubeVirtInterfaces {
				r := rule("PREROUTING", jump(ChainRedirect), in(ifc), dst(p))
				if f == V4 {
					b.insert4(NAT, 0, r)
				} else {
					b.insert6(NAT, 0, r)
				}
			}
			b.addFamily(f, NAT, rule(ChainOutput, jump(ChainRedirect), dst(p)))
		}
	}
}

// tproxyMarks keeps the mark TPROXY set on the connection, so that replies
// of the app to a connection the proxy made with the client's address
// route back to the proxy, and keeps the proxy's own connections to the
// pod apart from the app's loopback traffic.
func (b *builder) tproxyMarks() {
	cfg := b.cfg
	b.add(Mangle, rule("PREROUTING", ruleset.Target{Kind: ruleset.ConnmarkSave}, proto("tcp"), mark(cfg.TProxyMark)))
	b.add(Mangle, rule("OUTPUT", ret(), out("lo"), proto("tcp"), mark(cfg.TProxyMark)))
	for _, o := range owners(cfg) {
		b.addBoth(Mangle, func(f Family) ruleset.Rule {
			return rule("OUTPUT", ruleset.Target{Kind: ruleset.SetMark, Mark: OutboundMark}, out("lo"), proto("tcp"), notDst(b.lo(f)), owner(o))
		})
	}
	b.add(Mangle, rule("OUTPUT", ruleset.Target{Kind: ruleset.ConnmarkRestore}, proto("tcp"), connmark(cfg.TProxyMark)))
	b.insert(Mangle, 0, rule(ChainInbound, ret(), proto("tcp"), mark(cfg.TProxyMark)))
	b.insert4(Mangle, 1, rule(ChainInbound, ret(), in("lo"), proto("tcp"), src(single(PassthroughSource(V4)))))
	b.insert6(Mangle, 1, rule(ChainInbound, ret(), in("lo"), proto("tcp"), src(single(PassthroughSource(V6)))))
	b.insert(Mangle, 2, rule(ChainInbound, ret(), in("lo"), proto("tcp"), notMark(OutboundMark)))
}

// owners lists the proxy's uids then gids.
func owners(cfg Config) []Owner {
	var out []Owner
	for _, u := range cfg.ProxyUIDs {
		out = append(out, Owner{ID: u})
	}
	for _, g := range cfg.ProxyGIDs {
		out = append(out, Owner{ID: g, GID: true})
	}
	return out
}

// chainRules is the final order of the rules of each chain, and the order
// chains were first named, after replaying the ops a filter keeps.
type chainRules struct {
	order []string // every chain, in the order first named by a rule
	rules map[string][]ruleset.Rule
}

// replay applies the ops of a table that keep accepts. An insert at a
// position the chain does not have yet appends, as iptables' -I at
// length+1 and knftables' insert do.
func (b *builder) replay(table string, keep func(ruleset.Rule) bool) *chainRules {
	cr := &chainRules{rules: map[string][]ruleset.Rule{}}
	for _, o := range b.ops {
		if o.table != table || !keep(o.rule) {
			continue
		}
		c := o.rule.Chain
		if _, ok := cr.rules[c]; !ok {
			cr.order = append(cr.order, c)
			cr.rules[c] = nil
		}
		rs := cr.rules[c]
		if o.insert && o.pos < len(rs) {
			rs = slices.Insert(rs, o.pos, o.rule)
		} else {
			rs = append(rs, o.rule)
		}
		cr.rules[c] = rs
	}
	return cr
}

// iptables lays the rules of family f out as istio-iptables' restore
// payload does: per table, the user chains of the rules in order, then
// those only jumped to; rules chain by chain.
func (b *builder) iptables(f Family) *RuleSet {
	rs := &RuleSet{Family: f}
	for _, table := range tableOrder {
		cr := b.replay(table, func(r ruleset.Rule) bool { return r.Family == 0 || r.Family == f })
		if len(cr.order) == 0 {
			continue
		}
		t := &TableRules{Name: table}
		for _, c := range cr.order {
			if !ruleset.IsBuiltin(c) {
				t.Chains = append(t.Chains, c)
			}
		}
		for _, o := range b.ops {
			r := o.rule
			if o.table == table && (r.Family == 0 || r.Family == f) && r.Target.Kind == ruleset.Jump && !slices.Contains(t.Chains, r.Target.Chain) {
				t.Chains = append(t.Chains, r.Target.Chain)
			}
		}
		for _, c := range cr.order {
			t.Rules = append(t.Rules, cr.rules[c]...)
		}
		rs.Tables = append(rs.Tables, t)
	}
	return rs
}

// NftTables are istio-nftables' inet tables, one per iptables table, in
// the order it writes them.
var NftTables = []struct{ Name, Table string }{
	{"istio-proxy-nat", NAT}, {"istio-proxy-mangle", Mangle}, {"istio-proxy-raw", Raw},
}

// nftChainOrder is the order istio-nftables declares each table's chains
// (only those with rules are created).
var nftChainOrder = map[string][]string{
	NAT:    {"PREROUTING", "OUTPUT", ChainInbound, ChainRedirect, ChainInRedirect, ChainOutput, ChainOutputDNS},
	Mangle: {"PREROUTING", "OUTPUT", ChainDivert, ChainTProxy, ChainInbound, ChainDrop},
	Raw:    {"PREROUTING", "OUTPUT", ChainInbound, ChainOutputDNS},
}

// nftables lays the rules out as istio-nftables does: per table, the
// chains that have rules in its fixed order, rules chain by chain.
func (b *builder) nftables() *RuleSet {
	rs := &RuleSet{}
	for _, nt := range NftTables {
		cr := b.replay(nt.Table, func(ruleset.Rule) bool { return true })
		t := &TableRules{Name: nt.Table}
		for _, c := range nftChainOrder[nt.Table] {
			if len(cr.rules[c]) == 0 {
				continue
			}
			t.Chains = append(t.Chains, c)
			t.Rules = append(t.Rules, cr.rules[c]...)
		}
		if len(t.Rules) > 0 {
			rs.Tables = append(rs.Tables, t)
		}
	}
	return rs
}
