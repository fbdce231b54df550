package announce

import (
	"bytes"
	"net"
	"testing"
)

func TestNAMessage(t *testing.T) {
	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	b, err := naMessage(net.ParseIP("fd20::5"), mac)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{136, 0, 0, 0, 0x20, 0, 0, 0}
	want = append(want, net.ParseIP("fd20::5").To16()...)
	want = append(want, 2, 1, 2, 0, 0, 0, 0, 1)
	if !bytes.Equal(b, want) {
		t.Fatalf("NA\n got % x\nwant % x", b, want)
	}
}

func TestParseJobArg(t *testing.T) {
	ifName, ips, err := parseJobArg("eth0;198.18.16.5,fd20::5")
	if err != nil || ifName != "eth0" || len(ips) != 2 || !ips[1].Equal(net.ParseIP("fd20::5")) {
		t.Fatalf("got %q %v %v", ifName, ips, err)
	}
	for _, bad := range []string{"", "eth0", ";1.2.3.4", "eth0;nonsense"} {
		if _, _, err := parseJobArg(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
