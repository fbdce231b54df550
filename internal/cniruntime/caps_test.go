package cniruntime

import (
	"strings"
	"testing"
)

func TestParsePort(t *testing.T) {
	ok := []struct {
		in   string
		want PortMapping
	}{
		{"8080:80", PortMapping{8080, 80, "tcp", ""}},
		{"53:53/udp", PortMapping{53, 53, "udp", ""}},
		{"9:9/SCTP", PortMapping{9, 9, "sctp", ""}},
		{"127.0.0.1:8080:80", PortMapping{8080, 80, "tcp", "127.0.0.1"}},
		{"[::1]:8080:80/udp", PortMapping{8080, 80, "udp", "::1"}},
	}
	for _, c := range ok {
		got, err := ParsePort(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParsePort(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	bad := map[string]string{
		"8080":             "HOST:CONTAINER",
		"0:80":             "host port",
		"80:70000":         "container port",
		"80:80/icmp":       "protocol",
		"x:80":             "host port",
		"1.2.3:80:80":      "not an IP",
		"[::1:80:80":       "unterminated",
		"1:2:3:4":          "HOST:CONTAINER",
		"127.0.0.1:80:-1":  "container port",
		"127.0.0.1:80:80/": "protocol",
	}
	for in, want := range bad {
		if _, err := ParsePort(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParsePort(%q) error %v, want one mentioning %q", in, err, want)
		}
	}
}

func TestParseRate(t *testing.T) {
	ok := map[string]uint64{
		"10mbit": 10e6, "1gbit": 1e9, "500kbit": 500e3, "10M": 10e6, "2.5g": 2.5e9,
		"1mbps": 8e6, "100000": 100000, "1tbit": 1e12,
	}
	for in, want := range ok {
		if got, err := ParseRate(in); err != nil || got != want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "fast", "0", "-1mbit", "10", "999bit", "11tbit", "mbit"} {
		if _, err := ParseRate(in); err == nil {
			t.Errorf("ParseRate(%q) succeeded, want an error", in)
		}
	}
}

func TestBandwidthFor(t *testing.T) {
	b := BandwidthFor(100e6)
	if b.IngressRate != 100e6 || b.EgressRate != 100e6 || b.IngressBurst != 5e6 || b.EgressBurst != 5e6 {
		t.Fatalf("BandwidthFor(100mbit) = %+v", b)
	}
	if b := BandwidthFor(1e6); b.IngressBurst != 64*1024*8 {
		t.Fatalf("small rates get the 64 KiB floor, got %d", b.IngressBurst)
	}
}
