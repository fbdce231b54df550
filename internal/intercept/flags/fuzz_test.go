package flags

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary command lines (NUL-separated arguments) and one
// environment value: Parse must never panic, must answer a *UsageError or a
// configuration whose capture ports are usable, and must be deterministic.
func FuzzParse(f *testing.F) {
	f.Add(strings.Join(istioInjected, "\x00"), "")
	f.Add("-m\x00TPROXY\x00-b\x0080,443\x00-i\x0010.0.0.0/8,fd70::/16", "")
	f.Add("--redirect-dns\x00--capture-all-dns", "15001")
	f.Add("-p\x0015006", "")
	f.Add("", "*")
	f.Add("-x\x00::ffff:10.0.0.0/104", "")
	f.Fuzz(func(t *testing.T, argv, envVal string) {
		var args []string
		if argv != "" {
			args = strings.Split(argv, "\x00")
		}
		env := func(k string) string {
			if k == "ENVOY_PORT" || k == "ISTIO_SERVICE_CIDR" || k == "ISTIO_INBOUND_PORTS" {
				return envVal
			}
			return ""
		}
		o, err := Parse(args, env)
		_, err2 := Parse(args, env)
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
		for _, p := range c.OutboundCIDRs.Prefixes {
			if !p.IsValid() || p != p.Masked() {
				t.Fatalf("accepted prefix %v", p)
			}
		}
	})
}
