package main

import (
	"testing"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// FuzzParseConfig: any input either decodes or fails with code 6 or 7 (never
// a panic, never another code).
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.1.0","name":"n","type":"bridge","ipam":{"type":"host-local"}}`,
		`{"cniVersion":"1.1.0","name":"n","type":"bridge","bridge":"br0","vlan":5,"vlanTrunk":[{"minID":1,"maxID":3},{"id":9}],"ipMasq":true,"ipMasqBackend":"nftables","mtu":1400,"ipam":{"type":"host-local"}}`,
		`{"cniVersion":"1.1.0","name":"n","type":"bridge","runtimeConfig":{"mac":"02:00:00:00:00:01"},"args":{"cni":{"mac":"x"}},"ipam":{"type":"host-local"}}`,
		`{"type":"bridge","vlanTrunk":[null]}`,
		`[]`, ``, `{"type":5}`,
	} {
		f.Add([]byte(s), "MAC=02:00:00:00:00:02")
	}
	f.Fuzz(func(t *testing.T, data []byte, env string) {
		_, err := parseConfig(data, env)
		if err == nil {
			return
		}
		if c := cnierr.Code(err); c != cnierr.CodeDecoding && c != cnierr.CodeInvalidConfig {
			t.Fatalf("code %d for %q: %v", c, data, err)
		}
	})
}
