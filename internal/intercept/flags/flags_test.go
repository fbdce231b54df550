package flags

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/intercept"
)

func noEnv(string) string { return "" }

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// wantUsageError fails t unless err is a usage error naming want.
func wantUsageError(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatal("accepted")
	}
	if _, ok := err.(*UsageError); !ok {
		t.Fatalf("error %T is not a usage error", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name %s", err, want)
	}
}

// istioInjected is the command line Istio's sidecar injector gives
// istio-init.
var istioInjected = []string{"-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020", "--log_output_level=default:info"}

func TestParseDefaults(t *testing.T) {
	o, err := Parse(nil, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	c := o.Config
	// istio-iptables' defaults: nothing captured until -b / -i say so.
	want := intercept.Config{
		ProxyPort: 15001, InboundCapturePort: 15006, InboundTunnelPort: 15008,
		ProxyUIDs: []uint32{1337}, ProxyGIDs: []uint32{1337}, Mode: intercept.ModeRedirect,
		TProxyMark: 1337, TProxyRouteTable: 133,
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("defaults:\n got %+v\nwant %+v", c, want)
	}
	if o.ProbePort != 15002 || o.ProbeTimeout != 5*time.Second || o.Backend != (firewall.Backend{}) || o.ResolvConf != "/etc/resolv.conf" {
		t.Fatalf("option defaults: %+v", o)
	}
}

func TestParseIstioInjected(t *testing.T) {
	o, err := Parse(istioInjected, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	c := o.Config
	if !c.InboundPorts.All || !c.OutboundCIDRs.All || len(c.OutboundCIDRsExclude) != 0 ||
		!reflect.DeepEqual(c.InboundPortsExclude, []uint16{15090, 15021, 15020}) {
		t.Fatalf("istio's injected flags parsed as %+v", c)
	}
}

func TestParseForms(t *testing.T) {
	cases := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(o Options) bool
	}{
		{"long with =", []string{"--envoy-port=16001"}, nil, func(o Options) bool { return o.Config.ProxyPort == 16001 }},
		{"short attached", []string{"-p16001"}, nil, func(o Options) bool { return o.Config.ProxyPort == 16001 }},
		{"env", nil, map[string]string{"ENVOY_PORT": "16001"}, func(o Options) bool { return o.Config.ProxyPort == 16001 }},
		{"command line wins", []string{"-p", "16002"}, map[string]string{"ENVOY_PORT": "16001"}, func(o Options) bool { return o.Config.ProxyPort == 16002 }},
		{"env bool", nil, map[string]string{"REDIRECT_DNS": "true", "CAPTURE_ALL_DNS": "1"}, func(o Options) bool { return o.Config.RedirectDNS && o.Config.CaptureAllDNS }},
		{"istio env aliases", nil, map[string]string{"ISTIO_META_DNS_CAPTURE": "true", "ISTIO_DUAL_STACK": "true"}, func(o Options) bool { return o.Config.RedirectDNS && o.DualStack }},
		// istio binds the alias after the flag's own variable: it wins.
		{"alias after own env", nil, map[string]string{"REDIRECT_DNS": "false", "ISTIO_META_DNS_CAPTURE": "true"}, func(o Options) bool { return o.Config.RedirectDNS }},
		{"env list", nil, map[string]string{"ISTIO_INBOUND_PORTS": "80, 443", "ISTIO_SERVICE_CIDR": "10.0.0.0/8,fd70::/16"}, func(o Options) bool {
			return reflect.DeepEqual(o.Config.InboundPorts.Ports, []uint16{80, 443}) && len(o.Config.OutboundCIDRs.Prefixes) == 2
		}},
		{"gid defaults to uids", []string{"-u", "1337,1338"}, nil, func(o Options) bool {
			return reflect.DeepEqual(o.Config.ProxyGIDs, []uint32{1337, 1338})
		}},
		{"gid", []string{"-u", "1337", "-g", "2000"}, nil, func(o Options) bool { return reflect.DeepEqual(o.Config.ProxyGIDs, []uint32{2000}) }},
		{"tproxy lower case", []string{"-m", "tproxy", "-t", "0x100", "-r", "200"}, nil, func(o Options) bool {
			return o.Config.Mode == intercept.ModeTProxy && o.Config.TProxyMark == 0x100 && o.Config.TProxyRouteTable == 200
		}},
		{"bare address is a /32", []string{"-x", "10.1.2.3,fd70::1"}, nil, func(o Options) bool {
			return reflect.DeepEqual(o.Config.OutboundCIDRsExclude, []netip.Prefix{netip.MustParsePrefix("10.1.2.3/32"), netip.MustParsePrefix("fd70::1/128")})
		}},
		{"cidr masked", []string{"-i", "10.1.2.3/8"}, nil, func(o Options) bool {
			return o.Config.OutboundCIDRs.Prefixes[0] == netip.MustParsePrefix("10.0.0.0/8")
		}},
		{"tunnel port 0 disables", []string{"-e", "0"}, nil, func(o Options) bool { return o.Config.InboundTunnelPort == 0 }},
		{"backend", []string{"--iptables-backend", "nftables"}, nil, func(o Options) bool { return o.Backend.Kind == firewall.NFTables }},
		{"backend legacy", []string{"--iptables-backend=legacy"}, nil, func(o Options) bool { return o.Backend.Variant == firewall.VariantLegacy }},
		{"dry run short", []string{"-n"}, nil, func(o Options) bool { return o.DryRun }},
		{"interfaces", []string{"-k", "k6t-eth0", "-c", "net1,net2"}, nil, func(o Options) bool {
			return reflect.DeepEqual(o.Config.KubeVirtInterfaces, []string{"k6t-eth0"}) && len(o.Config.ExcludeInterfaces) == 2
		}},
		{"validation", []string{"--run-validation", "--iptables-probe-port", "15999", "--probe-timeout", "2s"}, nil, func(o Options) bool {
			return o.RunValidation && o.ProbePort == 15999 && o.ProbeTimeout == 2*time.Second
		}},
		{"help", []string{"--help"}, nil, func(o Options) bool { return o.Help }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, err := Parse(tc.args, envOf(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(o) {
				t.Fatalf("parsed %+v", o)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		args []string
		env  map[string]string
		want string // the flag the message must name
	}{
		{[]string{"--no-such-flag"}, nil, "--no-such-flag"},
		{[]string{"-y"}, nil, "'y'"},
		{[]string{"stray"}, nil, `"stray"`},
		{[]string{"-p", "0"}, nil, "--envoy-port"},
		{[]string{"-p", "65536"}, nil, "--envoy-port"},
		{[]string{"-z", "x"}, nil, "--inbound-capture-port"},
		{[]string{"-e", "-1"}, nil, "--inbound-tunnel-port"},
		{[]string{"-u", ","}, nil, "--proxy-uid"},
		{[]string{"-u", "istio"}, nil, "--proxy-uid"},
		{[]string{"-g", "1,x"}, nil, "--proxy-gid"},
		{[]string{"-m", "DNAT"}, nil, "--istio-inbound-interception-mode"},
		{[]string{"-t", "0"}, nil, "--istio-inbound-tproxy-mark"},
		{[]string{"-r", "254"}, nil, "--istio-inbound-tproxy-route-table"},
		{[]string{"-b", "80,*"}, nil, "--istio-inbound-ports"},
		{[]string{"-d", "http"}, nil, "--istio-local-exclude-ports"},
		{[]string{"-i", "10.0.0.0/33"}, nil, "--istio-service-cidr"},
		{[]string{"-i", "*,10.0.0.0/8"}, nil, "--istio-service-cidr"},
		{[]string{"-x", "*"}, nil, "--istio-service-exclude-cidr"},
		{[]string{"-q", "99999"}, nil, "--istio-outbound-ports"},
		{[]string{"-o", "1,2,x"}, nil, "--istio-local-outbound-ports-exclude"},
		{[]string{"-k", "a/b"}, nil, "--kube-virt-interfaces"},
		{[]string{"-c", "averyveryverylongname"}, nil, "--istio-exclude-interfaces"},
		{[]string{"--probe-timeout", "soon"}, nil, "--probe-timeout"},
		{[]string{"--probe-timeout", "-1s"}, nil, "--probe-timeout"},
		{[]string{"--iptables-backend", "pf"}, nil, "--iptables-backend"},
		{[]string{"-p", "15006"}, nil, "--inbound-capture-port"},
		{[]string{"-e", "15001"}, nil, "--inbound-tunnel-port"},
		{[]string{"--run-validation", "--iptables-probe-port", "15001"}, nil, "--iptables-probe-port"},
		{[]string{"-m", "TPROXY", "-t", "1338"}, nil, "--istio-inbound-tproxy-mark"},
		{[]string{"--cleanup-only", "--reconcile"}, nil, "--reconcile"},
		{[]string{"--cleanup-only", "--run-validation"}, nil, "--run-validation"},
		{[]string{"--skip-rule-apply"}, nil, "--skip-rule-apply"},
		{[]string{"-q", "80", "-o", "80"}, nil, "--istio-local-outbound-ports-exclude"},
		{nil, map[string]string{"ENVOY_PORT": "abc"}, "ENVOY_PORT"},
		{nil, map[string]string{"DRY_RUN": "maybe"}, "DRY_RUN"},
		{[]string{"--dry-run=maybe"}, nil, "dry-run"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := Parse(tc.args, envOf(tc.env))
			wantUsageError(t, err, tc.want)
		})
	}
}
