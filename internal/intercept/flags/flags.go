// Package flags reads istio-iptables' command line (and the environment
// variables named after its flags) into an interception Config and the
// options around it, with the same defaults and meaning. iptables-init
// parses its arguments with it, and the intercept CNI plugin its config
// (whose keys are the same flag names).
package flags

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/intercept"
)

// Options is everything the command line and the environment ask for.
type Options struct {
	Config        intercept.Config
	DualStack     bool
	DryRun        bool
	CleanupOnly   bool
	Reconcile     bool
	RunValidation bool
	SkipRuleApply bool
	ProbePort     uint16
	ProbeTimeout  time.Duration
	Backend       firewall.Backend // zero: detect
	NetNS         string
	ResolvConf    string
	Help          bool
	Usage         string
}

// UsageError is a bad command line: exit status 2, nothing changed.
type UsageError struct {
	Flag string // "--envoy-port (-p)", or "" for errors not about one flag
	Long string // the flag's long name ("envoy-port"), or ""
	Msg  string
}

func (e *UsageError) Error() string {
	if e.Flag == "" {
		return e.Msg
	}
	return e.Flag + ": " + e.Msg
}

// flagDef is one flag: istio-iptables' name, shorthand and default.
type flagDef struct {
	long, short, def, usage string
	isBool                  bool
	noEnv                   bool     // accepted for compatibility, ignored
	envAliases              []string // other variables istio reads for it, after the flag's own
}

var flagDefs = []flagDef{
	{long: "envoy-port", short: "p", def: "15001", usage: "port the proxy listens on for outbound connections"},
	{long: "inbound-capture-port", short: "z", def: "15006", usage: "port the proxy listens on for inbound connections"},
	{long: "inbound-tunnel-port", short: "e", def: "15008", usage: "inbound port never captured (the proxy's tunnel)"},
	{long: "proxy-uid", short: "u", def: "1337", usage: "comma-separated uids of the proxy: their connections are not captured"},
	{long: "proxy-gid", short: "g", def: "", usage: "comma-separated gids of the proxy (default: the uids)"},
	{long: "istio-inbound-interception-mode", short: "m", def: "REDIRECT", usage: "REDIRECT or TPROXY"},
	{long: "istio-inbound-tproxy-mark", short: "t", def: "1337", usage: "packet mark of TPROXY-diverted packets"},
	{long: "istio-inbound-tproxy-route-table", short: "r", def: "133", usage: "routing table TPROXY-marked packets are looked up in"},
	{long: "istio-inbound-ports", short: "b", def: "", usage: `inbound ports to capture: "*" for all, a comma-separated list, or empty for none`},
	{long: "istio-local-exclude-ports", short: "d", def: "", usage: `inbound ports not captured when -b is "*"`},
	{long: "istio-service-cidr", short: "i", def: "", usage: `outbound destinations to capture: "*" for all, comma-separated CIDRs, or empty for none`},
	{long: "istio-service-exclude-cidr", short: "x", def: "", usage: "comma-separated CIDRs never captured outbound"},
	{long: "istio-outbound-ports", short: "q", def: "", usage: "comma-separated outbound ports captured whatever the destination"},
	{long: "istio-local-outbound-ports-exclude", short: "o", def: "", usage: "comma-separated outbound ports never captured"},
	{long: "kube-virt-interfaces", short: "k", def: "", usage: "comma-separated interfaces whose incoming traffic is treated as outbound"},
	{long: "istio-exclude-interfaces", short: "c", def: "", usage: "comma-separated interfaces left alone entirely"},
	{long: "redirect-dns", isBool: true, envAliases: []string{"ISTIO_META_DNS_CAPTURE"}, usage: "capture DNS (UDP and TCP port 53) to the proxy's DNS port 15053"},
	{long: "capture-all-dns", isBool: true, usage: "with --redirect-dns: capture DNS to any server, not only the resolv.conf ones"},
	{long: "drop-invalid", isBool: true, usage: "drop packets conntrack finds invalid"},
	{long: "dual-stack", isBool: true, envAliases: []string{"ISTIO_DUAL_STACK"}, usage: "program IPv6 rules as well (also done when the pod has a global IPv6 address)"},
	{long: "dry-run", short: "n", isBool: true, usage: "print what would be applied and change nothing"},
	{long: "cleanup-only", isBool: true, usage: "remove every interception rule, chain and route installed, then exit"},
	{long: "reconcile", isBool: true, usage: "replace interception rules installed with other flags"},
	{long: "run-validation", isBool: true, usage: "check that redirection works from inside the pod; exit 126 when it does not"},
	{long: "skip-rule-apply", isBool: true, usage: "with --run-validation: validate only"},
	{long: "iptables-probe-port", def: "15002", usage: "port run-validation connects to"},
	{long: "probe-timeout", def: "5s", usage: "how long run-validation waits"},
	{long: "iptables-backend", def: "", usage: "legacy, nft (iptables variants) or nftables (native tables); default: what the pod already uses"},
	{long: "network-namespace", def: "", usage: "network namespace file to work in (default: the current one)"},
	{long: "resolv-conf", def: "/etc/resolv.conf", usage: "resolv.conf whose nameservers --redirect-dns captures"},
	{long: "restore-format", isBool: true, noEnv: true, usage: "accepted for compatibility (always on)"},
	{long: "log_output_level", def: "", noEnv: true, usage: "accepted for compatibility (ignored)"},
	{long: "log_as_json", isBool: true, noEnv: true, usage: "accepted for compatibility (ignored)"},
	{long: "log_caller", def: "", noEnv: true, usage: "accepted for compatibility (ignored)"},
	{long: "log_stacktrace_level", def: "", noEnv: true, usage: "accepted for compatibility (ignored)"},
	{long: "log_target", def: "", noEnv: true, usage: "accepted for compatibility (ignored)"},
}

// EnvName is the environment variable that sets a flag: its long name in
// upper case with dashes as underscores (ENVOY_PORT, ISTIO_INBOUND_PORTS).
func EnvName(long string) string {
	return strings.ToUpper(strings.ReplaceAll(long, "-", "_"))
}

func flagName(d flagDef) string {
	if d.short != "" {
		return fmt.Sprintf("--%s (-%s)", d.long, d.short)
	}
	return "--" + d.long
}

// Parse reads the command line, then the environment for every flag the
// command line did not set. Any error is a *UsageError naming the flag.
func Parse(args []string, getenv func(string) string) (Options, error) {
	fs := pflag.NewFlagSet("iptables-init", pflag.ContinueOnError)
	var usage bytes.Buffer
	fs.SetOutput(&usage)
	fs.SortFlags = false
	strs := map[string]*string{}
	bools := map[string]*bool{}
	for _, d := range flagDefs {
		if d.isBool {
			bools[d.long] = fs.BoolP(d.long, d.short, false, d.usage)
		} else {
			strs[d.long] = fs.StringP(d.long, d.short, d.def, d.usage)
		}
	}
	help := fs.BoolP("help", "h", false, "show this help")
	fs.PrintDefaults()
	o := Options{Usage: "Usage: iptables-init [flags]\n\nEvery flag can also be set with the environment variable named after it\n(ENVOY_PORT, ISTIO_INBOUND_PORTS, ...); the command line wins.\n\n" + usage.String()}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			o.Help = true
			return o, nil
		}
		return o, &UsageError{Msg: err.Error()}
	}
	if *help {
		o.Help = true
		return o, nil
	}
	if fs.NArg() > 0 {
		return o, &UsageError{Msg: fmt.Sprintf("unexpected argument %q (iptables-init takes flags only)", fs.Arg(0))}
	}
	fromEnv := map[string]string{}
	for _, d := range flagDefs {
		if fs.Changed(d.long) || d.noEnv {
			continue
		}
		env := EnvName(d.long)
		v := getenv(env)
		for _, alias := range d.envAliases {
			if v == "" {
				env, v = alias, getenv(alias)
			}
		}
		if v == "" {
			continue
		}
		if err := fs.Set(d.long, v); err != nil {
			return o, &UsageError{Flag: flagName(d), Long: d.long, Msg: fmt.Sprintf("environment variable %s=%q: %v", env, v, err)}
		}
		fromEnv[d.long] = env
	}
	v := func(long string) string { return strings.TrimSpace(*strs[long]) }
	b := func(long string) bool { return *bools[long] }
	def := func(long string) flagDef {
		for _, d := range flagDefs {
			if d.long == long {
				return d
			}
		}
		panic(long)
	}
	bad := func(long, format string, a ...any) error {
		name := flagName(def(long))
		if env := fromEnv[long]; env != "" {
			name += " (set by " + env + ")"
		}
		return &UsageError{Flag: name, Long: long, Msg: fmt.Sprintf(format, a...)}
	}

	c := intercept.Config{}
	var err error
	port := func(long string, zeroOK bool) uint16 {
		if err != nil {
			return 0
		}
		var p uint16
		p, err = parsePort(v(long), zeroOK)
		if err != nil {
			err = bad(long, "%v", err)
		}
		return p
	}
	ports := func(long string) []uint16 {
		if err != nil {
			return nil
		}
		var ps []uint16
		ps, err = parsePorts(v(long))
		if err != nil {
			err = bad(long, "%v", err)
		}
		return ps
	}
	c.ProxyPort = port("envoy-port", false)
	c.InboundCapturePort = port("inbound-capture-port", false)
	c.InboundTunnelPort = port("inbound-tunnel-port", true)
	c.InboundPortsExclude = ports("istio-local-exclude-ports")
	c.OutboundPorts = ports("istio-outbound-ports")
	c.OutboundPortsExclude = ports("istio-local-outbound-ports-exclude")
	o.ProbePort = port("iptables-probe-port", false)
	if err != nil {
		return o, err
	}
	if c.ProxyUIDs, err = parseIDs(v("proxy-uid")); err != nil {
		return o, bad("proxy-uid", "%v", err)
	}
	if len(c.ProxyUIDs) == 0 {
		return o, bad("proxy-uid", "at least one uid is needed")
	}
	c.ProxyGIDs = c.ProxyUIDs
	if v("proxy-gid") != "" {
		if c.ProxyGIDs, err = parseIDs(v("proxy-gid")); err != nil {
			return o, bad("proxy-gid", "%v", err)
		}
	}
	switch strings.ToUpper(v("istio-inbound-interception-mode")) {
	case "REDIRECT", "":
		c.Mode = intercept.ModeRedirect
	case "TPROXY":
		c.Mode = intercept.ModeTProxy
	default:
		return o, bad("istio-inbound-interception-mode", "%q is not a mode (want REDIRECT or TPROXY)", v("istio-inbound-interception-mode"))
	}
	mark, perr := strconv.ParseUint(v("istio-inbound-tproxy-mark"), 0, 32)
	if perr != nil || mark == 0 {
		return o, bad("istio-inbound-tproxy-mark", "%q is not a mark (want a number from 1 to 0xffffffff)", v("istio-inbound-tproxy-mark"))
	}
	c.TProxyMark = uint32(mark)
	table, perr := strconv.ParseUint(v("istio-inbound-tproxy-route-table"), 10, 32)
	if perr != nil || table == 0 || table >= 253 && table <= 255 {
		return o, bad("istio-inbound-tproxy-route-table", "%q is not a usable routing table (want 1 to 4294967295, not 253-255: default, main, local)", v("istio-inbound-tproxy-route-table"))
	}
	c.TProxyRouteTable = uint32(table)

	in := v("istio-inbound-ports")
	if in == "*" {
		c.InboundPorts.All = true
	} else if c.InboundPorts.Ports, err = parsePorts(in); err != nil {
		return o, bad("istio-inbound-ports", "%v", err)
	}
	if c.OutboundCIDRs, err = parseCIDRs(v("istio-service-cidr"), true); err != nil {
		return o, bad("istio-service-cidr", "%v", err)
	}
	ex, err := parseCIDRs(v("istio-service-exclude-cidr"), false)
	if err != nil {
		return o, bad("istio-service-exclude-cidr", "%v", err)
	}
	c.OutboundCIDRsExclude = ex.Prefixes
	if c.KubeVirtInterfaces, err = parseIfaces(v("kube-virt-interfaces")); err != nil {
		return o, bad("kube-virt-interfaces", "%v", err)
	}
	if c.ExcludeInterfaces, err = parseIfaces(v("istio-exclude-interfaces")); err != nil {
		return o, bad("istio-exclude-interfaces", "%v", err)
	}
	c.RedirectDNS = b("redirect-dns")
	c.CaptureAllDNS = b("capture-all-dns")
	c.DropInvalid = b("drop-invalid")
	o.DualStack = b("dual-stack")
	o.DryRun = b("dry-run")
	o.CleanupOnly = b("cleanup-only")
	o.Reconcile = b("reconcile")
	o.RunValidation = b("run-validation")
	o.SkipRuleApply = b("skip-rule-apply")
	o.NetNS = v("network-namespace")
	o.ResolvConf = v("resolv-conf")
	if o.ProbeTimeout, err = time.ParseDuration(v("probe-timeout")); err != nil || o.ProbeTimeout <= 0 {
		return o, bad("probe-timeout", "%q is not a positive duration (e.g. 5s)", v("probe-timeout"))
	}
	if s := v("iptables-backend"); s != "" {
		switch strings.ToLower(s) {
		case "legacy", "nft", "nftables", "iptables-legacy", "iptables-nft":
			o.Backend, _ = firewall.Parse(s)
		default:
			return o, bad("iptables-backend", "%q is not a backend (want legacy, nft or nftables)", s)
		}
	}
	o.Config = c
	return o, contradictions(o)
}

// contradictions rejects flag combinations that cannot mean anything.
func contradictions(o Options) error {
	c := o.Config
	bad := func(long, format string, a ...any) error {
		for _, d := range flagDefs {
			if d.long == long {
				return &UsageError{Flag: flagName(d), Long: long, Msg: fmt.Sprintf(format, a...)}
			}
		}
		panic(long)
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
		if !containsPort(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

func containsPort(list []uint16, p uint16) bool {
	for _, x := range list {
		if x == p {
			return true
		}
	}
	return false
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

// IsBool reports whether long names a boolean flag.
func IsBool(long string) bool {
	for _, d := range flagDefs {
		if d.long == long {
			return d.isBool
		}
	}
	return false
}

// Known reports whether long is the long name of a flag.
func Known(long string) bool {
	for _, d := range flagDefs {
		if d.long == long {
			return true
		}
	}
	return false
}
