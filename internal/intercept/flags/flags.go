// Package flags reads istio-iptables' command line (and the environment
// variables named after its flags, and those it reads on their own) into an
// interception Config and the options around it, with the same defaults and
// meaning. iptables-init parses its arguments with it, and the intercept CNI
// plugin its config (whose keys are the same flag names).
package flags

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
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
	ForceApply    bool // rewrite the rules even when they are in place
	CNIMode       bool // lock xtables per pod namespace (see docs/iptables-init.md)
	RunValidation bool
	SkipRuleApply bool
	ProbePort     uint16
	ProbeTimeout  time.Duration
	Backend       firewall.Backend // zero: detect
	NetNS         string
	ResolvConf    string
	// EBPFFallback is the mode installed instead of EBPF mode where the
	// node cannot capture the pod ("": fail).
	EBPFFallback intercept.Mode
	Log          Log
	// Notes say, one sentence each, what was asked for and has no effect;
	// the command shows them as warnings.
	Notes []string
	Help  bool
	Usage string
}

// UsageError is a bad command line: exit status 2, nothing changed.
type UsageError struct {
	Flag string // "--envoy-port (-p)", an environment variable, or "" for errors not about one flag
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
	isList                  bool // may be repeated, each value kept (log_target)
	noEnv                   bool // no environment variable sets it (as in istio)
	// envAliases are other variables istio reads for it; as in istio, one
	// that is set wins over the flag's own variable.
	envAliases []string
	// envFallbacks are variables istio documents for it without reading
	// them; meshwire reads them when nothing else set the flag.
	envFallbacks []string
}

var flagDefs = []flagDef{
	{long: "envoy-port", short: "p", def: "15001", usage: "port the proxy listens on for outbound connections"},
	{long: "inbound-capture-port", short: "z", def: "15006", usage: "port the proxy listens on for inbound connections"},
	{long: "inbound-tunnel-port", short: "e", def: "15008", usage: "inbound port never captured (the proxy's tunnel)"},
	{long: "proxy-uid", short: "u", def: "", usage: "comma-separated uids of the proxy: their connections are not captured (default: the uid of user $ENVOY_USER, istio-proxy, else 1337)"},
	{long: "proxy-gid", short: "g", def: "", usage: "comma-separated gids of the proxy (default: the uids)"},
	{long: "istio-inbound-interception-mode", short: "m", def: "REDIRECT", envFallbacks: []string{"INBOUND_INTERCEPTION_MODE"}, usage: "REDIRECT, TPROXY or EBPF (no netfilter rule: the node's eBPF programs capture; see docs/ebpf-interception.md)"},
	{long: "ebpf-fallback", def: "", usage: "with EBPF mode, where this node cannot capture the pod (programs not attached, or without a hook it needs): REDIRECT or TPROXY rules instead of failing"},
	{long: "istio-inbound-tproxy-mark", short: "t", def: "1337", envFallbacks: []string{"INBOUND_TPROXY_MARK"}, usage: "packet mark of TPROXY-diverted packets"},
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
	{long: "drop-invalid", isBool: true, envAliases: []string{"INVALID_DROP"}, usage: "drop packets conntrack finds invalid"},
	{long: "dual-stack", isBool: true, envAliases: []string{"ISTIO_DUAL_STACK"}, usage: "program IPv6 rules as well (also done when the pod has a global IPv6 address)"},
	{long: "dry-run", short: "n", isBool: true, usage: "print what would be applied and change nothing"},
	{long: "cleanup-only", isBool: true, usage: "remove every interception rule, chain and route installed, then exit"},
	{long: "reconcile", isBool: true, usage: "replace interception rules installed with other flags"},
	{long: "force-apply", isBool: true, usage: "rewrite the rules even when they are already in place, replacing any others"},
	{long: "run-validation", isBool: true, usage: "check that redirection works from inside the pod; exit 126 when it does not"},
	{long: "skip-rule-apply", isBool: true, usage: "with --run-validation: validate only"},
	{long: "iptables-probe-port", def: "15002", usage: "port run-validation connects to"},
	{long: "probe-timeout", def: "5s", usage: "how long run-validation waits"},
	{long: "native-nftables", isBool: true, usage: "program native nftables tables instead of iptables rules (same as --iptables-backend nftables)"},
	{long: "force-iptables-binary", def: "", usage: "legacy or nft: the iptables variant to use (same as --iptables-backend)"},
	{long: "iptables-backend", def: "", usage: "legacy, nft (iptables variants) or nftables (native tables); default: what the pod already uses"},
	{long: "network-namespace", def: "", usage: "network namespace file to work in (default: the current one)"},
	{long: "cni-mode", isBool: true, usage: "with --network-namespace from the host: take the xtables lock on that file, not the node's"},
	{long: "resolv-conf", def: "/etc/resolv.conf", usage: "resolv.conf whose nameservers --redirect-dns captures"},
	{long: "iptables-trace-logging", isBool: true, usage: "accepted for compatibility with older Istio releases (no effect)"},
	{long: "restore-format", isBool: true, noEnv: true, usage: "accepted for compatibility (always on)"},
	{long: "log_output_level", def: "default:info", noEnv: true, usage: "minimum level of the messages shown: [scope:]level,... with level debug, info, warn, error, fatal or none (scopes default and all apply)"},
	{long: "log_as_json", isBool: true, noEnv: true, usage: "write messages as JSON lines"},
	{long: "log_target", isList: true, noEnv: true, usage: "where messages go: stdout, stderr or a file (repeatable; default stderr)"},
	{long: "log_caller", def: "", noEnv: true, usage: "accepted for compatibility (no effect)"},
	{long: "log_stacktrace_level", def: "default:none", noEnv: true, usage: "accepted for compatibility (checked, no effect)"},
	{long: "vklog", def: "0", noEnv: true, usage: "accepted for compatibility (klog verbosity; no effect)"},
}

// subcommand is the word Istio's injector puts before the flags (its image
// runs `pilot-agent istio-iptables ...`); iptables-init skips it.
const subcommand = "istio-iptables"

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

// findDef returns the flag long names.
func findDef(long string) (flagDef, bool) {
	i := slices.IndexFunc(flagDefs, func(d flagDef) bool { return d.long == long })
	if i < 0 {
		return flagDef{}, false
	}
	return flagDefs[i], true
}

func lookupDef(long string) flagDef {
	d, ok := findDef(long)
	if !ok {
		panic("flags: no flag " + long)
	}
	return d
}

// Parse reads the command line, then the environment getenv shows for every
// flag the command line did not set (an empty variable counts as unset).
// Any error is a *UsageError naming the flag.
func Parse(args []string, getenv func(string) string) (Options, error) {
	return ParseEnv(args, Env{LookupEnv: func(k string) (string, bool) {
		v := getenv(k)
		return v, v != ""
	}})
}

// ParseEnv is Parse with the environment and the user and group databases
// of env. Istio's rule holds: a flag beats its environment variables, which
// beat the default.
func ParseEnv(args []string, env Env) (Options, error) {
	p := newParser(env)
	if done, err := p.parseArgs(args); done || err != nil {
		return p.o, err
	}
	steps := []func() error{p.applyEnv, p.ports, p.identity, p.inboundMode, p.selections,
		p.switches, p.backend, p.logging, p.envOnly}
	for _, step := range steps {
		if err := step(); err != nil {
			return p.o, err
		}
	}
	return p.o, contradictions(p.o)
}

// parser is one Parse: the flag set, the values it holds and what it has
// decided so far.
type parser struct {
	fs      *pflag.FlagSet
	strs    map[string]*string
	bools   map[string]*bool
	lists   map[string]*[]string
	fromEnv map[string]string // long name: the variable that set it
	env     Env
	o       Options
}

func newParser(env Env) *parser {
	p := &parser{
		fs:   pflag.NewFlagSet("iptables-init", pflag.ContinueOnError),
		strs: map[string]*string{}, bools: map[string]*bool{}, lists: map[string]*[]string{},
		fromEnv: map[string]string{}, env: env,
	}
	var usage bytes.Buffer
	p.fs.SetOutput(&usage)
	p.fs.SortFlags = false
	for _, d := range flagDefs {
		switch {
		case d.isBool:
			p.bools[d.long] = p.fs.BoolP(d.long, d.short, false, d.usage)
		case d.isList:
			p.lists[d.long] = p.fs.StringArrayP(d.long, d.short, nil, d.usage)
		default:
			p.strs[d.long] = p.fs.StringP(d.long, d.short, d.def, d.usage)
		}
	}
	p.fs.BoolP("help", "h", false, "show this help")
	p.fs.PrintDefaults()
	p.o.Usage = usageHead + usage.String() + usageEnv
	return p
}

const usageHead = "Usage: iptables-init [istio-iptables] [flags]\n\n" +
	"Every flag but --restore-format, --vklog and --log_* can also be set with\n" +
	"the environment variable named after it (INBOUND_CAPTURE_PORT,\n" +
	"ISTIO_INBOUND_PORTS, ...); the command line wins.\n\n"

const usageEnv = `
Environment variables without a flag (as istio-iptables reads them):
  ISTIO_OUTBOUND_OWNER_GROUPS          groups (names or gids) whose outbound connections are captured, or "*" (default)
  ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE  with "*": groups whose outbound connections are not captured
  ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR    the IPv4 range taken for loopback (default 127.0.0.1/32)
  ENVOY_USER                           user whose uid is the default of --proxy-uid (default istio-proxy)
  ISTIO_META_DNS_CAPTURE, ISTIO_DUAL_STACK, INVALID_DROP
                                       set --redirect-dns, --dual-stack, --drop-invalid
  INBOUND_INTERCEPTION_MODE, INBOUND_TPROXY_MARK
                                       set -m and -t when nothing else does
`

// parseArgs reads the command line. done is set when there is nothing
// more to do (help).
func (p *parser) parseArgs(args []string) (done bool, err error) {
	if len(args) > 0 && args[0] == subcommand {
		args = args[1:]
	}
	if err := p.fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			p.o.Help = true
			return true, nil
		}
		return true, &UsageError{Msg: err.Error()}
	}
	if h, _ := p.fs.GetBool("help"); h {
		p.o.Help = true
		return true, nil
	}
	if p.fs.NArg() > 0 {
		return true, &UsageError{Msg: fmt.Sprintf("unexpected argument %q (iptables-init takes flags only)", p.fs.Arg(0))}
	}
	return false, nil
}

// str is a string flag's value, trimmed.
func (p *parser) str(long string) string { return strings.TrimSpace(*p.strs[long]) }

func (p *parser) bool(long string) bool { return *p.bools[long] }

// bad is a usage error about a flag, naming the variable that set it.
func (p *parser) bad(long, format string, a ...any) error {
	name := flagName(lookupDef(long))
	if env := p.fromEnv[long]; env != "" {
		name += " (set by " + env + ")"
	}
	return &UsageError{Flag: name, Long: long, Msg: fmt.Sprintf(format, a...)}
}

// IsBool reports whether long names a boolean flag.
func IsBool(long string) bool {
	d, ok := findDef(long)
	return ok && d.isBool
}

// Known reports whether long is the long name of a flag.
func Known(long string) bool {
	_, ok := findDef(long)
	return ok
}
