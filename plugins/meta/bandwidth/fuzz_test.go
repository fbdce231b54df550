package main

import (
	"testing"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// FuzzParseConfig: any input either decodes into limits the kernel can take
// or is refused with code 6 or 7; never a panic, never another code.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.0.0","name":"n","type":"bandwidth","ingressRate":1000,"ingressBurst":2000}`,
		`{"cniVersion":"1.0.0","name":"n","type":"bandwidth","runtimeConfig":{"bandwidth":{"IngressRate":10000000,"IngressBurst":4294967295,"EgressRate":0,"EgressBurst":0}}}`,
		`{"cniVersion":"1.0.0","name":"n","type":"bandwidth","egressRate":-1e3,"egressBurst":1.5}`,
		`{"cniVersion":"1.0.0","name":"n","type":"bandwidth","egressRate":"8","egressBurst":1e999999999}`,
		`{"cniVersion":"1.0.0","name":"n","type":"bandwidth","ingressRate":18446744073709551616,"ingressBurst":34359738360}`,
		`{}`, `[]`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, bw, err := parseConfig(data)
		if err != nil {
			if c := cnierr.Code(err); c != cnierr.CodeDecoding && c != cnierr.CodeInvalidConfig && c != cnierr.CodeIncompatibleVersion {
				t.Fatalf("code %d for %q: %v", c, data, err)
			}
			return
		}
		for _, l := range []Limit{bw.Ingress, bw.Egress} {
			if l.Shaped() && (l.Rate < minRate || l.Burst < 8 || l.Burst > maxBurst) {
				t.Fatalf("accepted %+v from %q", l, data)
			}
			if !l.Shaped() && l.Burst != 0 {
				t.Fatalf("burst without rate accepted from %q", data)
			}
			p := tbfFor(l, 1500, 15.625)
			if l.Shaped() && (p.Rate == 0 || p.Buffer == 0 || p.Limit == 0) {
				t.Fatalf("tbf %+v from %+v", p, l)
			}
		}
	})
}
