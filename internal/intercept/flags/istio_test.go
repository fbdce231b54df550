package flags

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/intercept"
)

// istioTemplate is the init container's argument list of Istio's current
// sidecar injection template (istio/istio
// manifests/charts/istio-control/istio-discovery/files/injection-template.yaml,
// 1.30.3 and master alike) with the chart's default values, before the
// optional flags.
var istioTemplate = []string{"istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT",
	"-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020", "--log_output_level=default:info"}

// lookupIn resolves names from a table, as the user or group database.
func lookupIn(db map[string]string) func(string) (string, error) {
	return func(name string) (string, error) {
		if id, ok := db[name]; ok {
			return id, nil
		}
		return "", fmt.Errorf("unknown name %s", name)
	}
}

// fakeEnv is an environment where a variable mapped to "" is set and
// empty, with users istio-proxy (1500) and envoy (1600) and groups java
// (1000) and ftp (21).
func fakeEnv(vars map[string]string) Env {
	return Env{
		LookupEnv: func(k string) (string, bool) {
			v, ok := vars[k]
			return v, ok
		},
		LookupUser:  lookupIn(map[string]string{"istio-proxy": "1500", "envoy": "1600"}),
		LookupGroup: lookupIn(map[string]string{"java": "1000", "ftp": "21"}),
	}
}

func noted(o Options, word string) bool {
	for _, n := range o.Notes {
		if strings.Contains(n, word) {
			return true
		}
	}
	return false
}

func with(base []string, more ...string) []string {
	return append(append([]string(nil), base...), more...)
}

var (
	nftables   = firewall.Backend{Kind: firewall.NFTables}
	legacy     = firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantLegacy}
	iptNFT     = firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantNFT}
	loopback8  = netip.MustParsePrefix("127.0.0.0/8")
	loopback16 = netip.MustParsePrefix("127.1.0.0/16")
)

// TestParseIstioFlags covers the flags and variables of istio-iptables
// 1.30 (and older releases' that Istio's templates still pass) beyond the
// rule flags: their defaults, the environment, and istio's precedence
// (flag, then the variables, then the default).
func TestParseIstioFlags(t *testing.T) {
	cases := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(o Options) bool
	}{
		{"injector line", istioTemplate, nil, func(o Options) bool {
			c := o.Config
			return c.InboundPorts.All && c.OutboundCIDRs.All && len(c.InboundPortsExclude) == 3 && o.Log.Level == LevelInfo &&
				reflect.DeepEqual(c.ProxyUIDs, []uint32{1337}) && !o.ForceApply && o.Backend == (firewall.Backend{}) && len(o.Notes) == 0
		}},
		{"injector line, all options", with(istioTemplate, "--log_as_json", "--force-apply", "--native-nftables"), nil, func(o Options) bool {
			return o.Log.JSON && o.ForceApply && o.Backend == nftables && len(o.Notes) == 0
		}},
		{"injector line, CNI validation", with(istioTemplate, "--run-validation", "--skip-rule-apply"), nil, func(o Options) bool {
			return o.RunValidation && o.SkipRuleApply
		}},
		{"subcommand word only first", []string{"istio-iptables"}, nil, func(o Options) bool { return o.Config.ProxyPort == 15001 }},

		{"force-apply env", nil, map[string]string{"FORCE_APPLY": "true"}, func(o Options) bool { return o.ForceApply }},
		{"native-nftables env", nil, map[string]string{"NATIVE_NFTABLES": "true"}, func(o Options) bool { return o.Backend == nftables }},
		{"force-iptables-binary", []string{"--force-iptables-binary", "legacy"}, nil, func(o Options) bool { return o.Backend == legacy }},
		{"force-iptables-binary env", nil, map[string]string{"FORCE_IPTABLES_BINARY": "nft"}, func(o Options) bool { return o.Backend == iptNFT }},
		{"native-nftables makes the binary moot", []string{"--native-nftables", "--force-iptables-binary=legacy"}, nil, func(o Options) bool {
			return o.Backend == nftables && noted(o, "--force-iptables-binary")
		}},
		{"backend flags that agree", []string{"--iptables-backend", "nft", "--force-iptables-binary", "nft"}, nil, func(o Options) bool { return o.Backend == iptNFT }},
		{"cni-mode", []string{"--cni-mode", "--network-namespace", "/run/netns/x"}, nil, func(o Options) bool { return o.CNIMode && len(o.Notes) == 0 }},
		{"cni-mode env without namespace", nil, map[string]string{"CNI_MODE": "true"}, func(o Options) bool { return o.CNIMode && noted(o, "--cni-mode") }},
		{"trace logging", []string{"--iptables-trace-logging"}, nil, func(o Options) bool { return noted(o, "--iptables-trace-logging") }},
		{"trace logging env", nil, map[string]string{"IPTABLES_TRACE_LOGGING": "true"}, func(o Options) bool { return noted(o, "--iptables-trace-logging") }},
		{"reconcile, cleanup, dry run env", nil, map[string]string{"RECONCILE": "1", "DRY_RUN": "true"}, func(o Options) bool { return o.Reconcile && o.DryRun }},
		{"cleanup env", nil, map[string]string{"CLEANUP_ONLY": "true"}, func(o Options) bool { return o.CleanupOnly }},

		{"log level bare", []string{"--log_output_level=debug"}, nil, func(o Options) bool { return o.Log.Level == LevelDebug }},
		{"log level all wins last", []string{"--log_output_level=default:warn,all:error"}, nil, func(o Options) bool { return o.Log.Level == LevelError }},
		{"log level other scope", []string{"--log_output_level=ads:debug,grpc:none"}, nil, func(o Options) bool { return o.Log.Level == LevelInfo }},
		{"log level none", []string{"--log_output_level", "none"}, nil, func(o Options) bool { return o.Log.Level == LevelNone }},
		{"log targets", []string{"--log_target", "stdout", "--log_target=/tmp/x.log"}, nil, func(o Options) bool {
			return reflect.DeepEqual(o.Log.Targets, []string{"stdout", "/tmp/x.log"})
		}},
		{"log flags without effect", []string{"--log_caller=default", "--log_stacktrace_level=default:error", "--vklog=9", "--restore-format"}, nil, func(o Options) bool {
			return len(o.Notes) == 0
		}},
		{"log flags have no variables", nil, map[string]string{"LOG_OUTPUT_LEVEL": "bogus", "LOG_AS_JSON": "true"}, func(o Options) bool {
			return o.Log.Level == LevelInfo && !o.Log.JSON
		}},

		{"INVALID_DROP", nil, map[string]string{"INVALID_DROP": "true"}, func(o Options) bool { return o.Config.DropInvalid }},
		{"ISTIO_DUAL_STACK after DUAL_STACK", nil, map[string]string{"DUAL_STACK": "true", "ISTIO_DUAL_STACK": "false"}, func(o Options) bool { return !o.DualStack }},
		{"flag beats env", []string{"-z", "16006"}, map[string]string{"INBOUND_CAPTURE_PORT": "17006"}, func(o Options) bool { return o.Config.InboundCapturePort == 16006 }},
		{"env beats default", nil, map[string]string{"INBOUND_CAPTURE_PORT": "17006"}, func(o Options) bool { return o.Config.InboundCapturePort == 17006 }},
		{"flag false beats env true", []string{"--redirect-dns=false"}, map[string]string{"ISTIO_META_DNS_CAPTURE": "true"}, func(o Options) bool { return !o.Config.RedirectDNS }},
		{"empty variable is unset", nil, map[string]string{"INBOUND_CAPTURE_PORT": "", "REDIRECT_DNS": ""}, func(o Options) bool {
			return o.Config.InboundCapturePort == 15006 && !o.Config.RedirectDNS
		}},

		{"INBOUND_INTERCEPTION_MODE", nil, map[string]string{"INBOUND_INTERCEPTION_MODE": "TPROXY"}, func(o Options) bool { return o.Config.Mode == intercept.ModeTProxy }},
		{"ISTIO_INBOUND_INTERCEPTION_MODE first", nil, map[string]string{"ISTIO_INBOUND_INTERCEPTION_MODE": "REDIRECT", "INBOUND_INTERCEPTION_MODE": "TPROXY"}, func(o Options) bool {
			return o.Config.Mode == intercept.ModeRedirect
		}},
		{"-m beats INBOUND_INTERCEPTION_MODE", []string{"-m", "REDIRECT"}, map[string]string{"INBOUND_INTERCEPTION_MODE": "TPROXY"}, func(o Options) bool {
			return o.Config.Mode == intercept.ModeRedirect
		}},
		{"INBOUND_TPROXY_MARK", nil, map[string]string{"INBOUND_TPROXY_MARK": "0x100"}, func(o Options) bool { return o.Config.TProxyMark == 0x100 }},
		{"ISTIO_INBOUND_TPROXY_MARK first", nil, map[string]string{"ISTIO_INBOUND_TPROXY_MARK": "7", "INBOUND_TPROXY_MARK": "8"}, func(o Options) bool { return o.Config.TProxyMark == 7 }},

		{"owner groups default", nil, nil, func(o Options) bool { return reflect.DeepEqual(o.Config.OutboundGroups, intercept.GroupFilter{}) }},
		{"owner groups all but", nil, map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS": "*", "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE": "888, ftp,888"}, func(o Options) bool {
			return reflect.DeepEqual(o.Config.OutboundGroups, intercept.GroupFilter{GIDs: []uint32{888, 21}})
		}},
		{"owner groups exclude alone", nil, map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE": "888"}, func(o Options) bool {
			return reflect.DeepEqual(o.Config.OutboundGroups, intercept.GroupFilter{GIDs: []uint32{888}})
		}},
		{"owner groups only", nil, map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS": "java,202"}, func(o Options) bool {
			return reflect.DeepEqual(o.Config.OutboundGroups, intercept.GroupFilter{Only: true, GIDs: []uint32{1000, 202}})
		}},
		{"owner groups set and empty: nobody", nil, map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS": ""}, func(o Options) bool {
			return reflect.DeepEqual(o.Config.OutboundGroups, intercept.GroupFilter{Only: true})
		}},
		{"owner groups exclude ignored with a list", nil, map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS": "202", "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE": "888"}, func(o Options) bool {
			return reflect.DeepEqual(o.Config.OutboundGroups, intercept.GroupFilter{Only: true, GIDs: []uint32{202}}) && noted(o, "EXCLUDE is ignored")
		}},
		{"owner groups 64", nil, map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS": gidList(64)}, func(o Options) bool { return len(o.Config.OutboundGroups.GIDs) == 64 }},

		{"loopback cidr", nil, map[string]string{"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": "127.0.0.0/8"}, func(o Options) bool { return o.Config.IPv4Loopback == loopback8 }},
		{"loopback cidr masked", nil, map[string]string{"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": "127.1.2.3/16"}, func(o Options) bool { return o.Config.IPv4Loopback == loopback16 }},

		{"ENVOY_USER default istio-proxy", nil, nil, func(o Options) bool {
			return reflect.DeepEqual(o.Config.ProxyUIDs, []uint32{1500}) && reflect.DeepEqual(o.Config.ProxyGIDs, []uint32{1500})
		}},
		{"ENVOY_USER", nil, map[string]string{"ENVOY_USER": "envoy"}, func(o Options) bool { return reflect.DeepEqual(o.Config.ProxyUIDs, []uint32{1600}) }},
		{"ENVOY_USER unknown", nil, map[string]string{"ENVOY_USER": "nobody-here"}, func(o Options) bool { return reflect.DeepEqual(o.Config.ProxyUIDs, []uint32{1337}) }},
		{"PROXY_UID beats ENVOY_USER", nil, map[string]string{"PROXY_UID": "1700", "ENVOY_USER": "envoy"}, func(o Options) bool {
			return reflect.DeepEqual(o.Config.ProxyUIDs, []uint32{1700})
		}},
		{"-u empty is ENVOY_USER's", []string{"-u", ""}, map[string]string{"ENVOY_USER": "envoy"}, func(o Options) bool {
			return reflect.DeepEqual(o.Config.ProxyUIDs, []uint32{1600})
		}},
		{"-g with ENVOY_USER", []string{"-g", "2000"}, nil, func(o Options) bool {
			return reflect.DeepEqual(o.Config.ProxyUIDs, []uint32{1500}) && reflect.DeepEqual(o.Config.ProxyGIDs, []uint32{2000})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, err := ParseEnv(tc.args, fakeEnv(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(o) {
				t.Fatalf("parsed %+v", o)
			}
		})
	}
}

func gidList(n int) string {
	var ids []string
	for i := 0; i < n; i++ {
		ids = append(ids, fmt.Sprint(3000+i))
	}
	return strings.Join(ids, ",")
}

// TestParseWithoutDatabases checks Parse (the CNI plugin's way, no user or
// group database): the default uid is 1337 and group names are refused.
func TestParseWithoutDatabases(t *testing.T) {
	o, err := Parse(nil, noEnv)
	if err != nil || !reflect.DeepEqual(o.Config.ProxyUIDs, []uint32{1337}) {
		t.Fatalf("defaults without a user database: %v %+v", err, o.Config)
	}
	if _, err := Parse(nil, envOf(map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE": "ftp"})); err == nil || !strings.Contains(err.Error(), "cannot be resolved") {
		t.Fatalf("a group name without a group database: %v", err)
	}
}

func TestParseIstioErrors(t *testing.T) {
	cases := []struct {
		args []string
		env  map[string]string
		want string // what the message must name
	}{
		{nil, map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS": "nosuch"}, "ISTIO_OUTBOUND_OWNER_GROUPS="},
		{nil, map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS": "*,1"}, "ISTIO_OUTBOUND_OWNER_GROUPS="},
		{nil, map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS": gidList(65)}, "at most 64"},
		{nil, map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE": "1,nosuch"}, "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE="},
		{nil, map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE": "4294967295"}, "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE="},
		{nil, map[string]string{"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": "10.0.0.0/8"}, "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR"},
		{nil, map[string]string{"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": "127.0.0.1"}, "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR"},
		{nil, map[string]string{"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": "127.0.0.0/7"}, "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR"},
		{nil, map[string]string{"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": "::1/128"}, "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR"},
		{nil, map[string]string{"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": "::ffff:127.0.0.1/128"}, "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR"},
		{[]string{"--force-iptables-binary", "iptables"}, nil, "--force-iptables-binary"},
		{nil, map[string]string{"FORCE_IPTABLES_BINARY": "xtables"}, "FORCE_IPTABLES_BINARY"},
		{[]string{"--native-nftables", "--iptables-backend", "legacy"}, nil, "--native-nftables"},
		{[]string{"--iptables-backend", "legacy", "--force-iptables-binary", "nft"}, nil, "--force-iptables-binary"},
		{nil, map[string]string{"NATIVE_NFTABLES": "maybe"}, "NATIVE_NFTABLES"},
		{nil, map[string]string{"FORCE_APPLY": "yes please"}, "FORCE_APPLY"},
		{nil, map[string]string{"INVALID_DROP": "maybe"}, "INVALID_DROP"},
		{nil, map[string]string{"INBOUND_TPROXY_MARK": "zero"}, "INBOUND_TPROXY_MARK"},
		{nil, map[string]string{"INBOUND_INTERCEPTION_MODE": "NONE"}, "INBOUND_INTERCEPTION_MODE"},
		{[]string{"--log_output_level=default:loud"}, nil, "--log_output_level"},
		{[]string{"--log_output_level=a:b:c"}, nil, "--log_output_level"},
		{[]string{"--log_stacktrace_level=verbose"}, nil, "--log_stacktrace_level"},
		{[]string{"--vklog=high"}, nil, "--vklog"},
		{[]string{"--log_target", " "}, nil, "--log_target"},
		{[]string{"--iptables-trace-logging=sometimes"}, nil, "iptables-trace-logging"},
		{[]string{"istio-iptables", "istio-iptables"}, nil, `"istio-iptables"`},
		{[]string{"-p", "15001", "istio-iptables"}, nil, `"istio-iptables"`},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " ")+fmt.Sprint(tc.env), func(t *testing.T) {
			_, err := ParseEnv(tc.args, fakeEnv(tc.env))
			wantUsageError(t, err, tc.want)
		})
	}
}

// TestEveryIstioFlagKnown lists the flags of istio-iptables 1.30.3's root
// command (tools/istio-iptables/pkg/cmd/root.go and the logging flags
// pilot-agent attaches), plus those older releases had: each is accepted.
func TestEveryIstioFlagKnown(t *testing.T) {
	istio := []string{
		"envoy-port", "inbound-capture-port", "inbound-tunnel-port", "proxy-uid", "proxy-gid",
		"istio-inbound-interception-mode", "istio-inbound-ports", "istio-local-exclude-ports",
		"istio-exclude-interfaces", "istio-service-cidr", "istio-service-exclude-cidr", "istio-outbound-ports",
		"istio-local-outbound-ports-exclude", "kube-virt-interfaces", "istio-inbound-tproxy-mark",
		"istio-inbound-tproxy-route-table", "dry-run", "iptables-probe-port", "probe-timeout", "skip-rule-apply",
		"run-validation", "redirect-dns", "drop-invalid", "dual-stack", "capture-all-dns", "network-namespace",
		"cni-mode", "reconcile", "cleanup-only", "force-apply", "native-nftables", "force-iptables-binary",
		"log_target", "log_as_json", "log_output_level", "log_stacktrace_level", "log_caller", "vklog",
		// older releases
		"iptables-trace-logging", "restore-format",
	}
	for _, long := range istio {
		if !Known(long) {
			t.Errorf("--%s is not accepted", long)
		}
	}
	shorts := map[string]string{"p": "envoy-port", "z": "inbound-capture-port", "e": "inbound-tunnel-port", "u": "proxy-uid",
		"g": "proxy-gid", "m": "istio-inbound-interception-mode", "b": "istio-inbound-ports", "d": "istio-local-exclude-ports",
		"c": "istio-exclude-interfaces", "i": "istio-service-cidr", "x": "istio-service-exclude-cidr", "q": "istio-outbound-ports",
		"o": "istio-local-outbound-ports-exclude", "k": "kube-virt-interfaces", "t": "istio-inbound-tproxy-mark",
		"r": "istio-inbound-tproxy-route-table", "n": "dry-run"}
	for short, long := range shorts {
		if d := lookupDef(long); d.short != short {
			t.Errorf("--%s: shorthand %q, istio's is %q", long, d.short, short)
		}
	}
}
