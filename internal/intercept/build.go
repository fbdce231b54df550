package intercept

import (
	"net/netip"
	"slices"
)

// TableRules is what one table holds: meshwire's user chains (in the order
// they were first used) and every rule, in order, user and built-in chains
// mixed.
type TableRules struct {
	Name   string
	Chains []string
	Rules  []Rule
}

// RuleSet is the whole rule set of one address family.
type RuleSet struct {
	Family Family
	Tables []*TableRules // raw, mangle, nat; only those with rules
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

// builder collects the rules of one family, table by table, and holds what
// every step of Build needs to know about the config.
type builder struct {
	cfg    Config
	f      Family
	tproxy bool
	// lo is the pod's loopback range of the family; passthrough the source
	// address of the proxy's passthrough connections to the app.
	lo, passthrough netip.Prefix
	// inTable holds the inbound capture: nat for REDIRECT, mangle for TPROXY.
	inTable string
	tables  map[string]*TableRules
}

func (b *builder) add(table string, r Rule) {
	t := b.tables[table]
	if t == nil {
		t = &TableRules{Name: table}
		b.tables[table] = t
	}
	if !IsBuiltin(r.Chain) && !slices.Contains(t.Chains, r.Chain) {
		t.Chains = append(t.Chains, r.Chain)
	}
	if r.Target.Kind == Jump && !slices.Contains(t.Chains, r.Target.Chain) {
		t.Chains = append(t.Chains, r.Target.Chain)
	}
	t.Rules = append(t.Rules, r)
}

func jump(chain string) Target         { return Target{Kind: Jump, Chain: chain} }
func ret() Target                      { return Target{Kind: Return} }
func redirect(port uint16) Target      { return Target{Kind: Redirect, Port: port} }
func zone(z uint16) Target             { return Target{Kind: CTZone, Zone: z} }
func single(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// Build renders cfg into the rule set of family f, rule for rule what
// istio-iptables programs for the same flags (with the user chains only
// created where they are used). Each step appends its rules to the tables
// in istio-iptables' order.
func Build(cfg Config, f Family) *RuleSet {
	b := newBuilder(cfg, f)
	b.excludedInterfaces()
	b.dropInvalid()
	b.kubeVirtInterfaces()
	b.inbound()
	if b.tproxy {
		b.tproxyMarks()
	}
	b.outbound()
	b.dnsUDP()
	return b.ruleSet()
}

func newBuilder(cfg Config, f Family) *builder {
	b := &builder{
		cfg:         cfg,
		f:           f,
		tproxy:      cfg.Mode == ModeTProxy,
		lo:          cfg.loopback(f),
		passthrough: single(PassthroughSource(f)),
		inTable:     NAT,
		tables:      map[string]*TableRules{},
	}
	if b.tproxy {
		b.inTable = Mangle
	}
	return b
}

// ruleSet lists the tables that got rules, in tableOrder.
func (b *builder) ruleSet() *RuleSet {
	rs := &RuleSet{Family: b.f}
	for _, name := range tableOrder {
		if t := b.tables[name]; t != nil {
			rs.Tables = append(rs.Tables, t)
		}
	}
	return rs
}

// excludedInterfaces leaves the excluded interfaces alone entirely.
func (b *builder) excludedInterfaces() {
	for _, ifc := range b.cfg.ExcludeInterfaces {
		b.add(NAT, Rule{Chain: "PREROUTING", In: ifc, Target: ret()})
		b.add(NAT, Rule{Chain: "OUTPUT", Out: ifc, Target: ret()})
		if b.tproxy {
			b.add(Mangle, Rule{Chain: "PREROUTING", In: ifc, Target: ret()})
			b.add(Mangle, Rule{Chain: "OUTPUT", Out: ifc, Target: ret()})
		}
	}
}

// dropInvalid drops packets conntrack finds invalid, when asked.
func (b *builder) dropInvalid() {
	if b.cfg.DropInvalid {
		b.add(Mangle, Rule{Chain: "PREROUTING", CTState: "INVALID", Target: Target{Kind: Drop}})
	}
}

// kubeVirtInterfaces: traffic from virtual machines behind kube-virt
// interfaces is outbound traffic of the pod, never inbound: it skips the
// inbound capture.
func (b *builder) kubeVirtInterfaces() {
	cfg, f := b.cfg, b.f
	for _, ifc := range cfg.KubeVirtInterfaces {
		if b.tproxy && !cfg.InboundPorts.Empty() {
			b.add(Mangle, Rule{Chain: "PREROUTING", In: ifc, Target: ret()})
		}
		for _, p := range prefixesOf(f, cfg.OutboundCIDRsExclude) {
			b.add(NAT, Rule{Chain: "PREROUTING", In: ifc, Dst: p, Target: ret()})
		}
		if cfg.OutboundCIDRs.All {
			b.add(NAT, Rule{Chain: "PREROUTING", In: ifc, Target: jump(ChainRedirect)})
		} else {
			for _, p := range prefixesOf(f, cfg.OutboundCIDRs.Prefixes) {
				b.add(NAT, Rule{Chain: "PREROUTING", In: ifc, Dst: p, Target: jump(ChainRedirect)})
			}
			b.add(NAT, Rule{Chain: "PREROUTING", In: ifc, Target: ret()})
		}
	}
}

// inbound captures the inbound ports: REDIRECT to the inbound capture port,
// or with TPROXY a mark and a divert to it.
func (b *builder) inbound() {
	cfg := b.cfg
	b.add(NAT, Rule{Chain: ChainInRedirect, Proto: "tcp", Target: redirect(cfg.InboundCapturePort)})
	if cfg.InboundPorts.Empty() {
		return
	}
	if b.tproxy {
		b.add(Mangle, Rule{Chain: ChainDivert, Target: Target{Kind: SetMark, Mark: cfg.TProxyMark}})
		b.add(Mangle, Rule{Chain: ChainDivert, Target: Target{Kind: Accept}})
		b.add(Mangle, Rule{Chain: ChainTProxy, Dst: b.lo, NotDst: true, Proto: "tcp",
			Target: Target{Kind: TProxy, Port: cfg.InboundCapturePort, Mark: cfg.TProxyMark}})
	}
	b.add(b.inTable, Rule{Chain: "PREROUTING", Proto: "tcp", Target: jump(ChainInbound)})
	if b.tproxy {
		// Packets already diverted, the proxy's passthrough connections
		// to the app and any other loopback traffic but the proxy's own
		// (marked OutboundMark in OUTPUT) are never captured again.
		b.add(Mangle, Rule{Chain: ChainInbound, Proto: "tcp", Mark: cfg.TProxyMark, Target: ret()})
		b.add(Mangle, Rule{Chain: ChainInbound, Proto: "tcp", In: "lo", Src: b.passthrough, Target: ret()})
		b.add(Mangle, Rule{Chain: ChainInbound, Proto: "tcp", In: "lo", Mark: OutboundMark, NotMark: true, Target: ret()})
		// Replies to connections the pod (or a VM behind a kube-virt
		// interface, which the pod forwards) opened are routed as
		// usual, never diverted to the proxy.
		b.add(Mangle, Rule{Chain: ChainInbound, Proto: "tcp", CTState: "RELATED,ESTABLISHED", CTDir: "REPLY", Target: ret()})
	}
	if cfg.InboundTunnelPort != 0 {
		b.add(b.inTable, Rule{Chain: ChainInbound, Proto: "tcp", DPort: cfg.InboundTunnelPort, Target: ret()})
	}
	if cfg.InboundPorts.All {
		for _, p := range cfg.InboundPortsExclude {
			b.add(b.inTable, Rule{Chain: ChainInbound, Proto: "tcp", DPort: p, Target: ret()})
		}
		b.captureInbound(0)
		return
	}
	for _, p := range cfg.InboundPorts.Ports {
		b.captureInbound(p)
	}
}

// captureInbound sends inbound TCP to port (0: any port) to the proxy.
func (b *builder) captureInbound(port uint16) {
	if b.tproxy {
		b.add(Mangle, Rule{Chain: ChainInbound, Proto: "tcp", DPort: port, CTState: "RELATED,ESTABLISHED", Target: jump(ChainDivert)})
		b.add(Mangle, Rule{Chain: ChainInbound, Proto: "tcp", DPort: port, Target: jump(ChainTProxy)})
		return
	}
	b.add(NAT, Rule{Chain: ChainInbound, Proto: "tcp", DPort: port, Target: jump(ChainInRedirect)})
}

// tproxyMarks keeps the mark TPROXY set on the connection, so that replies
// of the app to a connection the proxy made with the client's address route
// back to the proxy.
func (b *builder) tproxyMarks() {
	cfg := b.cfg
	b.add(Mangle, Rule{Chain: "PREROUTING", Proto: "tcp", Mark: cfg.TProxyMark, Target: Target{Kind: ConnmarkSave}})
	b.add(Mangle, Rule{Chain: "OUTPUT", Proto: "tcp", Out: "lo", Mark: cfg.TProxyMark, Target: ret()})
	for _, o := range owners(cfg) {
		b.add(Mangle, Rule{Chain: "OUTPUT", Dst: b.lo, NotDst: true, Proto: "tcp", Out: "lo", Owners: []Owner{o},
			Target: Target{Kind: SetMark, Mark: OutboundMark}})
	}
	b.add(Mangle, Rule{Chain: "OUTPUT", Proto: "tcp", ConnMark: cfg.TProxyMark, Target: Target{Kind: ConnmarkRestore}})
}

// outbound captures the pod's outbound TCP: what is left alone (excluded
// ports, the proxy's own connections, owner groups, loopback, excluded
// ranges), DNS over TCP, then the captured ports and ranges.
func (b *builder) outbound() {
	cfg := b.cfg
	b.add(NAT, Rule{Chain: ChainRedirect, Proto: "tcp", Target: redirect(cfg.ProxyPort)})
	b.add(NAT, Rule{Chain: "OUTPUT", Proto: "tcp", Target: jump(ChainOutput)})
	for _, p := range cfg.OutboundPortsExclude {
		b.add(NAT, Rule{Chain: ChainOutput, Proto: "tcp", DPort: p, Target: ret()})
	}
	b.add(NAT, Rule{Chain: ChainOutput, Out: "lo", Src: b.passthrough, Target: ret()})
	b.proxyOutbound()
	for _, r := range groupRules(cfg.OutboundGroups, ChainOutput) {
		b.add(NAT, r)
	}
	b.dnsTCP()
	b.outboundDestinations()
}

// proxyOutbound: the proxy calling the pod's own address (a service VIP
// that resolved to this pod) goes through the inbound side; its other
// loopback traffic, and the app's, is left alone; none of its other
// connections is captured.
func (b *builder) proxyOutbound() {
	cfg := b.cfg
	for _, o := range owners(cfg) {
		self := Rule{Chain: ChainOutput, Out: "lo", Dst: b.lo, NotDst: true, Owners: []Owner{o}, Target: jump(ChainInRedirect)}
		other := Rule{Chain: ChainOutput, Out: "lo", Owners: []Owner{{ID: o.ID, GID: o.GID, Not: true}}, Target: ret()}
		if cfg.RedirectDNS {
			self.Proto, self.DPort, self.NotDPort = "tcp", 53, true
			other.Proto, other.DPort, other.NotDPort = "tcp", 53, true
		}
		b.add(NAT, self)
		if !cfg.includesLoopback() {
			b.add(NAT, other)
		}
		b.add(NAT, Rule{Chain: ChainOutput, Owners: []Owner{o}, Target: ret()})
	}
}

// dnsTCP sends DNS over TCP to the proxy's DNS port.
func (b *builder) dnsTCP() {
	if !b.cfg.RedirectDNS {
		return
	}
	if b.cfg.CaptureAllDNS {
		b.add(NAT, Rule{Chain: ChainOutput, Proto: "tcp", DPort: 53, Target: redirect(DNSCapturePort)})
		return
	}
	for _, s := range b.dnsServers() {
		b.add(NAT, Rule{Chain: ChainOutput, Dst: single(s), Proto: "tcp", DPort: 53, Target: redirect(DNSCapturePort)})
	}
}

// outboundDestinations leaves loopback and the excluded ranges alone and
// captures the outbound ports and ranges.
func (b *builder) outboundDestinations() {
	cfg, f := b.cfg, b.f
	b.add(NAT, Rule{Chain: ChainOutput, Dst: b.lo, Target: ret()})
	for _, p := range prefixesOf(f, cfg.OutboundCIDRsExclude) {
		b.add(NAT, Rule{Chain: ChainOutput, Dst: p, Target: ret()})
	}
	for _, p := range cfg.OutboundPorts {
		b.add(NAT, Rule{Chain: ChainOutput, Proto: "tcp", DPort: p, Target: jump(ChainRedirect)})
	}
	if cfg.OutboundCIDRs.All {
		b.add(NAT, Rule{Chain: ChainOutput, Target: jump(ChainRedirect)})
	} else if len(cfg.OutboundCIDRs.Prefixes) > 0 {
		for _, p := range prefixesOf(f, cfg.OutboundCIDRs.Prefixes) {
			b.add(NAT, Rule{Chain: ChainOutput, Dst: p, Target: jump(ChainRedirect)})
		}
		b.add(NAT, Rule{Chain: ChainOutput, Target: ret()})
	}
}

// dnsUDP sends DNS over UDP to the proxy's DNS port, with conntrack zones
// keeping the proxy's upstream queries apart from the app's.
func (b *builder) dnsUDP() {
	cfg := b.cfg
	if !cfg.RedirectDNS {
		return
	}
	servers := b.dnsServers()
	if !cfg.CaptureAllDNS && len(servers) == 0 {
		return
	}
	b.add(NAT, Rule{Chain: "OUTPUT", Proto: "udp", Target: jump(ChainOutputDNS)})
	for _, o := range owners(cfg) {
		b.add(NAT, Rule{Chain: ChainOutputDNS, Proto: "udp", DPort: 53, Owners: []Owner{o}, Target: ret()})
	}
	for _, r := range groupRules(cfg.OutboundGroups, ChainOutputDNS) {
		b.add(NAT, r)
	}
	b.add(Raw, Rule{Chain: "OUTPUT", Proto: "udp", Target: jump(ChainOutputDNS)})
	b.add(Raw, Rule{Chain: "PREROUTING", Proto: "udp", Target: jump(ChainInboundDNS)})
	for _, o := range owners(cfg) {
		b.add(Raw, Rule{Chain: ChainOutputDNS, Proto: "udp", DPort: 53, Owners: []Owner{o}, Target: zone(1)})
		b.add(Raw, Rule{Chain: ChainOutputDNS, Proto: "udp", SPort: DNSCapturePort, Owners: []Owner{o}, Target: zone(2)})
	}
	if cfg.CaptureAllDNS {
		b.add(NAT, Rule{Chain: ChainOutputDNS, Proto: "udp", DPort: 53, Target: redirect(DNSCapturePort)})
		b.add(Raw, Rule{Chain: ChainOutputDNS, Proto: "udp", DPort: 53, Target: zone(2)})
		b.add(Raw, Rule{Chain: ChainInboundDNS, Proto: "udp", SPort: 53, Target: zone(1)})
		return
	}
	for _, s := range servers {
		b.add(NAT, Rule{Chain: ChainOutputDNS, Dst: single(s), Proto: "udp", DPort: 53, Target: redirect(DNSCapturePort)})
		b.add(Raw, Rule{Chain: ChainOutputDNS, Dst: single(s), Proto: "udp", DPort: 53, Target: zone(2)})
		b.add(Raw, Rule{Chain: ChainInboundDNS, Src: single(s), Proto: "udp", SPort: 53, Target: zone(1)})
	}
}

// dnsServers are the configured DNS servers of the builder's family.
func (b *builder) dnsServers() []netip.Addr {
	var out []netip.Addr
	for _, s := range b.cfg.DNSServers {
		if hasAddr(b.f, s) {
			out = append(out, s)
		}
	}
	return out
}

// groupRules are the rules of chain that leave alone the connections the
// owner group filter does not capture (istio's handleCaptureByOwnerGroup):
// one RETURN per excluded group, or one RETURN for sockets of none of the
// groups captured.
func groupRules(g GroupFilter, chain string) []Rule {
	if !g.Only {
		var out []Rule
		for _, gid := range g.GIDs {
			out = append(out, Rule{Chain: chain, Owners: []Owner{{ID: gid, GID: true}}, Target: ret()})
		}
		return out
	}
	var noneOf []Owner
	for _, gid := range g.GIDs {
		noneOf = append(noneOf, Owner{ID: gid, GID: true, Not: true})
	}
	return []Rule{{Chain: chain, Owners: noneOf, Target: ret()}}
}

// owners lists the proxy's uids then gids as owner matches.
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
