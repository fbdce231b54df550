package apply

import (
	"net/netip"
	"testing"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/internal/intercept"
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

// TestSettingsOfIPv6: a pod's EBPF-mode entry, and the fast path's copy of
// any pod's interception, say pods.FlagIPv4Only exactly when its IPv6 is
// not intercepted (WantIPv6 false: its rules would have no IPv6 half).
func TestSettingsOfIPv6(t *testing.T) {
	for _, ipv6 := range []bool{false, true} {
		s, err := SettingsOf(intercept.Default(), nil, ipv6)
		if err != nil {
			t.Fatal(err)
		}
		m, err := MirrorOf(intercept.Default(), nil, ipv6)
		if err != nil {
			t.Fatal(err)
		}
		for name, flags := range map[string]uint32{"SettingsOf": s.Capture.Flags, "MirrorOf": m.Capture.Flags} {
			if only := flags&pods.FlagIPv4Only != 0; only == ipv6 {
				t.Errorf("%s with IPv6 %v: FlagIPv4Only %v", name, ipv6, only)
			}
		}
	}
}

// TestRegistrationDiffers: CHECK names an entry registered by a build
// before pods.FlagIPv4Only (the flag absent where this build sets it, all
// else the same), so that the agent's repair on an upgraded node says
// why; any other difference, the flag where the config wants IPv6 too
// included, is told as settings that differ.
func TestRegistrationDiffers(t *testing.T) {
	want := func(ipv6 bool) pods.Capture {
		t.Helper()
		s, err := SettingsOf(intercept.Default(), nil, ipv6)
		if err != nil {
			t.Fatal(err)
		}
		return s.Capture
	}
	v4, dual := want(false), want(true)
	earlier := v4
	earlier.Flags &^= pods.FlagIPv4Only
	otherPort := v4
	otherPort.OutboundPort++
	earlierOtherPort := earlier
	earlierOtherPort.OutboundPort++
	const differ = "the pod's ebpf interception settings differ from the config's"
	for _, tc := range []struct {
		name      string
		got, want pods.Capture
		err       string
	}{
		{"an earlier build's, IPv4 only", earlier, v4, earlierBuildEBPF},
		{"the flag where IPv6 is intercepted", v4, dual, differ},
		{"another port", otherPort, v4, differ},
		{"an earlier build's with another port", earlierOtherPort, v4, differ},
	} {
		if err := registrationDiffers(tc.got, tc.want); err == nil || err.Error() != tc.err {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
	}
}
