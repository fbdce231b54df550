package flags

import (
	"errors"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/intercept"
)

// FuzzParse feeds arbitrary command lines (NUL-separated arguments) and one
// environment value: ParseEnv must never panic, must answer a *UsageError or a
// configuration whose capture ports are usable, and must be deterministic.
func FuzzParse(f *testing.F) {
	f.Add(strings.Join(istioInjected, "\x00"), "")
	f.Add("-m\x00TPROXY\x00-b\x0080,443\x00-i\x0010.0.0.0/8,fd70::/16", "")
	f.Add("--redirect-dns\x00--capture-all-dns", "15001")
	f.Add("-p\x0015006", "")
	f.Add("", "*")
	f.Add("-x\x00::ffff:10.0.0.0/104", "")
	// Istio's injector line with its optional flags, and the variables
	// istio-iptables reads without a flag.
	f.Add(strings.Join(istioTemplate, "\x00")+"\x00--log_as_json\x00--force-apply\x00--native-nftables", "")
	f.Add(strings.Join(istioTemplate, "\x00")+"\x00--run-validation\x00--skip-rule-apply", "java,202")
	f.Add("--native-nftables\x00--force-iptables-binary=legacy\x00--iptables-backend=nft", "")
	f.Add("--log_output_level=default:debug,all:none\x00--log_target\x00stdout\x00--vklog=3", "")
	f.Add("-m\x00TPROXY\x00-b\x00*", "127.0.0.0/8")
	f.Add("-u\x00\x00-g\x00\x00--cni-mode", "*")
	f.Add("istio-iptables\x00istio-iptables", "")
	f.Add("--iptables-trace-logging\x00--restore-format\x00--log_caller=default", "0x100")
	f.Fuzz(func(t *testing.T, argv, envVal string) {
		var args []string
		if argv != "" {
			args = strings.Split(argv, "\x00")
		}
		// envVal sets a few variables, among them every one without a
		// flag (some of them then hold nonsense, which must be refused).
		env := fakeEnv(nil)
		env.LookupEnv = func(k string) (string, bool) {
			switch k {
			case "ENVOY_PORT", "ISTIO_SERVICE_CIDR", "ISTIO_INBOUND_PORTS", "INBOUND_TPROXY_MARK", "ENVOY_USER",
				"ISTIO_OUTBOUND_OWNER_GROUPS", "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR":
				return envVal, envVal != ""
			}
			return "", false
		}
		o, err := ParseEnv(args, env)
		_, err2 := ParseEnv(args, env)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("not deterministic: %v vs %v", err, err2)
		}
		if err != nil {
			var ue *UsageError
			if !errors.As(err, &ue) {
				t.Fatalf("error %T %v is not a usage error", err, err)
			}
			return
		}
		if o.Help {
			return
		}
		c := o.Config
		if c.ProxyPort == 0 || c.InboundCapturePort == 0 || c.ProxyPort == c.InboundCapturePort || len(c.ProxyUIDs) == 0 || len(c.ProxyGIDs) == 0 {
			t.Fatalf("accepted an unusable config %+v", c)
		}
		if g := c.OutboundGroups; g.Only && len(g.GIDs) > intercept.MaxOnlyGroups {
			t.Fatalf("accepted %d owner groups", len(g.GIDs))
		}
		if l := c.IPv4Loopback; l.IsValid() && (!l.Addr().Is4() || !l.Addr().IsLoopback() || l != l.Masked()) {
			t.Fatalf("accepted loopback range %v", l)
		}
		if o.Log.Level < LevelDebug || o.Log.Level > LevelNone {
			t.Fatalf("log level %d", o.Log.Level)
		}
		for _, p := range c.OutboundCIDRs.Prefixes {
			if !p.IsValid() || p != p.Masked() {
				t.Fatalf("accepted prefix %v", p)
			}
		}
	})
}
