package addressing

import (
	"net"
	"testing"
)

func TestNextIP(t *testing.T) {
	for in, want := range map[string]string{"198.18.16.0": "198.18.16.1", "198.18.16.255": "198.18.17.0", "fd20::": "fd20::1", "fd20::ffff": "fd20::1:0",
		"255.255.255.255": "0.0.0.0", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff": "::"} {
		for _, ip := range []net.IP{net.ParseIP(in), net.ParseIP(in).To4()} {
			if ip == nil {
				continue
			}
			got := NextIP(ip)
			if got.String() != want || len(got) != len(ip) {
				t.Errorf("NextIP(%s, %d bytes) = %s (%d bytes), want %s", in, len(ip), got, len(got), want)
			}
		}
	}
}
