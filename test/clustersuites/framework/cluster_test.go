package framework

import (
	"encoding/json"
	"testing"
)

// A description from before dual stack (no ipFamily) is IPv4 only.
func TestDescriptionFamily(t *testing.T) {
	for in, want := range map[string]string{
		`{"cni":"meshwire"}`:                                                 "ipv4",
		`{"cni":"meshwire","ipFamily":"ipv4"}`:                               "ipv4",
		`{"cni":"meshwire","ipFamily":"dual","podCIDR6":"fd6d:776b:1::/64"}`: "dual",
	} {
		var d Description
		if err := json.Unmarshal([]byte(in), &d); err != nil {
			t.Fatal(err)
		}
		if got := d.Family(); got != want {
			t.Errorf("%s: Family() = %q, want %q", in, got, want)
		}
	}
}
