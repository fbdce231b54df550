package flags

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/intercept"
)

// The steps of Parse, in order, each reading a group of flags into p.o.

// ports reads the capture, tunnel and probe ports and the port lists.
func (p *parser) ports() error {
	c := &p.o.Config
	var err error
	port := func(long string, zeroOK bool) uint16 {
		if err != nil {
			return 0
		}
		var n uint16
		if n, err = parsePort(p.str(long), zeroOK); err != nil {
			err = p.bad(long, "%v", err)
		}
		return n
	}
	list := func(long string) []uint16 {
		if err != nil {
			return nil
		}
		var ps []uint16
		if ps, err = parsePorts(p.str(long)); err != nil {
			err = p.bad(long, "%v", err)
		}
		return ps
	}
	c.ProxyPort = port("envoy-port", false)
	c.InboundCapturePort = port("inbound-capture-port", false)
	c.InboundTunnelPort = port("inbound-tunnel-port", true)
	c.InboundPortsExclude = list("istio-local-exclude-ports")
	c.OutboundPorts = list("istio-outbound-ports")
	c.OutboundPortsExclude = list("istio-local-outbound-ports-exclude")
	p.o.ProbePort = port("iptables-probe-port", false)
	return err
}

// identity reads the proxy's uids and gids; an empty -u means the uid of
// ENVOY_USER, as in istio.
func (p *parser) identity() error {
	c := &p.o.Config
	uids := p.str("proxy-uid")
	if uids == "" {
		uids = p.envoyUID()
	}
	var err error
	if c.ProxyUIDs, err = parseIDs(uids); err != nil {
		return p.bad("proxy-uid", "%v", err)
	}
	if len(c.ProxyUIDs) == 0 {
		return p.bad("proxy-uid", "at least one uid is needed")
	}
	c.ProxyGIDs = c.ProxyUIDs
	if p.str("proxy-gid") != "" {
		if c.ProxyGIDs, err = parseIDs(p.str("proxy-gid")); err != nil {
			return p.bad("proxy-gid", "%v", err)
		}
	}
	return nil
}

// inboundMode reads -m, -t and -r.
func (p *parser) inboundMode() error {
	c := &p.o.Config
	switch mode := p.str("istio-inbound-interception-mode"); strings.ToUpper(mode) {
	case "REDIRECT", "":
		c.Mode = intercept.ModeRedirect
	case "TPROXY":
		c.Mode = intercept.ModeTProxy
	case "EBPF":
		c.Mode = intercept.ModeEBPF
	default:
		return p.bad("istio-inbound-interception-mode", "%q is not a mode (want REDIRECT, TPROXY or EBPF)", mode)
	}
	switch fb := p.str("ebpf-fallback"); strings.ToUpper(fb) {
	case "":
	case "REDIRECT":
		p.o.EBPFFallback = intercept.ModeRedirect
	case "TPROXY":
		p.o.EBPFFallback = intercept.ModeTProxy
	default:
		return p.bad("ebpf-fallback", "%q is not a mode to fall back to (want REDIRECT or TPROXY)", fb)
	}
	mark, err := strconv.ParseUint(p.str("istio-inbound-tproxy-mark"), 0, 32)
	if err != nil || mark == 0 {
		return p.bad("istio-inbound-tproxy-mark", "%q is not a mark (want a number from 1 to 0xffffffff)", p.str("istio-inbound-tproxy-mark"))
	}
	c.TProxyMark = uint32(mark)
	table, err := strconv.ParseUint(p.str("istio-inbound-tproxy-route-table"), 10, 32)
	if err != nil || table == 0 || table >= 253 && table <= 255 {
		return p.bad("istio-inbound-tproxy-route-table", "%q is not a usable routing table (want 1 to 4294967295, not 253-255: default, main, local)", p.str("istio-inbound-tproxy-route-table"))
	}
	c.TProxyRouteTable = uint32(table)
	return nil
}

// selections reads what is captured: inbound ports, outbound CIDRs and
// interfaces.
func (p *parser) selections() error {
	c := &p.o.Config
	var err error
	if in := p.str("istio-inbound-ports"); in == "*" {
		c.InboundPorts.All = true
	} else if c.InboundPorts.Ports, err = parsePorts(in); err != nil {
		return p.bad("istio-inbound-ports", "%v", err)
	}
	if c.OutboundCIDRs, err = parseCIDRs(p.str("istio-service-cidr"), true); err != nil {
		return p.bad("istio-service-cidr", "%v", err)
	}
	ex, err := parseCIDRs(p.str("istio-service-exclude-cidr"), false)
	if err != nil {
		return p.bad("istio-service-exclude-cidr", "%v", err)
	}
	c.OutboundCIDRsExclude = ex.Prefixes
	if c.KubeVirtInterfaces, err = parseIfaces(p.str("kube-virt-interfaces")); err != nil {
		return p.bad("kube-virt-interfaces", "%v", err)
	}
	if c.ExcludeInterfaces, err = parseIfaces(p.str("istio-exclude-interfaces")); err != nil {
		return p.bad("istio-exclude-interfaces", "%v", err)
	}
	return nil
}

// switches reads the boolean options and the command's own settings.
func (p *parser) switches() error {
	c, o := &p.o.Config, &p.o
	c.RedirectDNS = p.bool("redirect-dns")
	c.CaptureAllDNS = p.bool("capture-all-dns")
	c.DropInvalid = p.bool("drop-invalid")
	o.DualStack = p.bool("dual-stack")
	o.DryRun = p.bool("dry-run")
	o.CleanupOnly = p.bool("cleanup-only")
	o.Reconcile = p.bool("reconcile")
	o.ForceApply = p.bool("force-apply")
	o.CNIMode = p.bool("cni-mode")
	o.RunValidation = p.bool("run-validation")
	o.SkipRuleApply = p.bool("skip-rule-apply")
	o.NetNS = p.str("network-namespace")
	o.ResolvConf = p.str("resolv-conf")
	if p.bool("iptables-trace-logging") {
		p.note("--iptables-trace-logging has no effect: istio-iptables dropped its NFLOG trace rules in Istio 1.25 and no current sidecar reads them")
	}
	if o.CNIMode && o.NetNS == "" {
		p.note("--cni-mode has no effect without --network-namespace: the xtables lock of the current namespace's filesystem is used")
	}
	var err error
	if o.ProbeTimeout, err = time.ParseDuration(p.str("probe-timeout")); err != nil || o.ProbeTimeout <= 0 {
		return p.bad("probe-timeout", "%q is not a positive duration (e.g. 5s)", p.str("probe-timeout"))
	}
	return nil
}

// backendChoice is the backend one flag asks for.
type backendChoice struct {
	long string
	b    firewall.Backend
}

// backend reads --iptables-backend and istio's --native-nftables and
// --force-iptables-binary; two of them asking for different backends is a
// usage error, except that (as in istio) --native-nftables makes
// --force-iptables-binary moot.
func (p *parser) backend() error {
	choices, err := p.backendChoices()
	if err != nil || len(choices) == 0 {
		return err
	}
	first := choices[0]
	for _, ch := range choices[1:] {
		if ch.b != first.b {
			return p.bad(ch.long, "asks for %s, but --%s asks for %s", ch.b, first.long, first.b)
		}
	}
	p.o.Backend = first.b
	return nil
}

func (p *parser) backendChoices() ([]backendChoice, error) {
	var out []backendChoice
	if s := p.str("iptables-backend"); s != "" {
		switch strings.ToLower(s) {
		case "legacy", "nft", "nftables", "iptables-legacy", "iptables-nft":
			b, _ := firewall.Parse(s)
			out = append(out, backendChoice{"iptables-backend", b})
		default:
			return nil, p.bad("iptables-backend", "%q is not a backend (want legacy, nft or nftables)", s)
		}
	}
	native := p.bool("native-nftables")
	if native {
		out = append(out, backendChoice{"native-nftables", firewall.Backend{Kind: firewall.NFTables}})
	}
	switch bin := strings.ToLower(p.str("force-iptables-binary")); {
	case bin != "" && bin != "legacy" && bin != "nft":
		return nil, p.bad("force-iptables-binary", "%q is not an iptables variant (want legacy or nft)", bin)
	case bin != "" && native:
		p.note("--force-iptables-binary=%s is ignored: --native-nftables programs nftables, not iptables (as in istio-iptables)", bin)
	case bin != "":
		out = append(out, backendChoice{"force-iptables-binary", firewall.Backend{Kind: firewall.IPTables, Variant: firewall.Variant(bin)}})
	}
	return out, nil
}

// contradictions rejects flag combinations that cannot mean anything.
func contradictions(o Options) error {
	c := o.Config
	bad := func(long, format string, a ...any) error {
		return &UsageError{Flag: flagName(lookupDef(long)), Long: long, Msg: fmt.Sprintf(format, a...)}
	}
	switch {
	case c.InboundCapturePort == c.ProxyPort:
		return bad("inbound-capture-port", "%d is also the outbound capture port (--envoy-port); the proxy needs two ports", c.ProxyPort)
	case c.InboundTunnelPort != 0 && (c.InboundTunnelPort == c.ProxyPort || c.InboundTunnelPort == c.InboundCapturePort):
		return bad("inbound-tunnel-port", "%d is also a capture port", c.InboundTunnelPort)
	case o.RunValidation && (o.ProbePort == c.ProxyPort || o.ProbePort == c.InboundCapturePort):
		return bad("iptables-probe-port", "%d is a capture port; the probe needs a port of its own", o.ProbePort)
	case c.Mode == intercept.ModeTProxy && c.TProxyMark == intercept.OutboundMark:
		return bad("istio-inbound-tproxy-mark", "%d is the mark of the proxy's own loopback connections in TPROXY mode; pick another", c.TProxyMark)
	case c.Mode == intercept.ModeEBPF && len(c.KubeVirtInterfaces) > 0:
		return bad("kube-virt-interfaces", "not available in EBPF mode (use REDIRECT or TPROXY for it)")
	case c.Mode == intercept.ModeEBPF && len(c.ExcludeInterfaces) > 0:
		return bad("istio-exclude-interfaces", "not available in EBPF mode: a connection's interface is not known when it is redirected, at connect() (use REDIRECT or TPROXY for it)")
	case c.Mode == intercept.ModeEBPF && len(c.ProxyUIDs)+len(c.ProxyGIDs) > intercept.MaxEBPFOwners:
		return bad("proxy-uid", "EBPF mode takes at most %d proxy uids and gids together", intercept.MaxEBPFOwners)
	case c.Mode == intercept.ModeEBPF && len(c.OutboundGroups.GIDs) > intercept.MaxEBPFGroups:
		return bad("istio-inbound-interception-mode", "EBPF mode takes at most %d owner groups (ISTIO_OUTBOUND_OWNER_GROUPS)", intercept.MaxEBPFGroups)
	case o.CleanupOnly && o.Reconcile:
		return bad("reconcile", "contradicts --cleanup-only (cleanup removes, reconcile installs)")
	case o.CleanupOnly && o.RunValidation:
		return bad("run-validation", "contradicts --cleanup-only (nothing would be left to validate)")
	case o.SkipRuleApply && o.CleanupOnly:
		return bad("skip-rule-apply", "contradicts --cleanup-only")
	case o.SkipRuleApply && !o.RunValidation:
		return bad("skip-rule-apply", "without --run-validation there is nothing left to do")
	}
	for _, p := range c.OutboundPorts {
		for _, q := range c.OutboundPortsExclude {
			if p == q {
				return bad("istio-local-outbound-ports-exclude", "port %d is also in --istio-outbound-ports (-q)", p)
			}
		}
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parsePort(s string, zeroOK bool) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || (n == 0 && !zeroOK) {
		lo := 1
		if zeroOK {
			lo = 0
		}
		return 0, fmt.Errorf("%q is not a port (want %d to 65535)", s, lo)
	}
	return uint16(n), nil
}

func parsePorts(s string) ([]uint16, error) {
	var out []uint16
	for _, f := range splitList(s) {
		p, err := parsePort(f, false)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

func parseIDs(s string) ([]uint32, error) {
	var out []uint32
	for _, f := range splitList(s) {
		n, err := strconv.ParseUint(f, 10, 32)
		if err != nil || n == 0xffffffff {
			return nil, fmt.Errorf("%q is not a numeric id", f)
		}
		out = append(out, uint32(n))
	}
	return out, nil
}

func parseCIDRs(s string, allowAll bool) (intercept.CIDRs, error) {
	var c intercept.CIDRs
	items := splitList(s)
	for _, f := range items {
		if f == "*" {
			if !allowAll || len(items) > 1 {
				return c, fmt.Errorf(`"*" must stand alone`)
			}
			c.All = true
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			a, aerr := netip.ParseAddr(f)
			if aerr != nil || a.Zone() != "" {
				return c, fmt.Errorf("%q is not a CIDR or an address", f)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-(p.Addr().BitLen()-p.Addr().Unmap().BitLen())).Masked()
		if !p.IsValid() {
			return c, fmt.Errorf("%q is not a CIDR or an address", f)
		}
		c.Prefixes = append(c.Prefixes, p)
	}
	return c, nil
}

func parseIfaces(s string) ([]string, error) {
	out := splitList(s)
	for _, n := range out {
		if len(n) > 15 || strings.ContainsAny(n, "/ \t\"'") || n == "." || n == ".." {
			return nil, fmt.Errorf("%q is not an interface name", n)
		}
	}
	return out, nil
}
