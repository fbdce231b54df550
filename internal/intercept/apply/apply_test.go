package apply

import (
	"net/netip"
	"testing"
)

func TestWantIPv6(t *testing.T) {
	a := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, x := range s {
			out = append(out, netip.MustParseAddr(x))
		}
		return out
	}
	for _, tc := range []struct {
		dual  bool
		addrs []netip.Addr
		want  bool
	}{
		{false, a("127.0.0.1", "10.0.0.2", "::1", "fe80::1"), false},
		// Dual stack needs an IPv6 address too.
		{true, a("10.0.0.2"), false},
		{true, a("10.0.0.2", "fe80::2", "fd70::2"), true},
		// Without it, the first address decides.
		{false, a("10.0.0.2", "fd70::2"), false},
		{false, a("::1", "fe80::2", "fd70::2", "10.0.0.2"), true},
		{false, a("2001:db8::2"), true},
		{false, nil, false},
		{true, nil, false},
		{false, a("::6", "10.0.0.2"), false},
	} {
		if got := WantIPv6(tc.dual, tc.addrs); got != tc.want {
			t.Errorf("WantIPv6(%v, %v) = %v", tc.dual, tc.addrs, got)
		}
	}
}
