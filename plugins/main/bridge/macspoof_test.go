package main

import (
	"context"
	"net"
	"testing"

	attid "github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/firewall/fwfake"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// TestMacSpoof: ADD, re-ADD, DEL (twice) and GC of the mac spoof tables,
// through the in-memory firewall.
func TestMacSpoof(t *testing.T) {
	ctx := context.Background()
	fw := fwfake.New(macSpoofBackend)
	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	a := attid.ID{Network: "mwtb", ContainerID: "c1", IfName: "eth0"}
	b := attid.ID{Network: "mwtb", ContainerID: "c2", IfName: "eth0"}
	foreign := attid.ID{Network: "other", ContainerID: "c3", IfName: "eth0"}
	for _, x := range []attid.ID{a, a, b, foreign} {
		if err := macSpoofInstall(ctx, fw, x, "veth1", mac); err != nil {
			t.Fatal(err)
		}
	}
	tb := fw.Table(ruleset.Bridge, a.MacSpoofTable())
	if tb == nil || len(tb.Chains) != 1 || len(tb.Chains[0].Rules) != 1 || tb.Chains[0].Hook != "prerouting" {
		t.Fatalf("table after a repeated ADD:\n%s", fw.Dump())
	}
	if r := tb.Chains[0].Rules[0]; r.In != "veth1" || r.Target != "DROP" {
		t.Fatalf("rule %+v", r)
	}
	for range 2 {
		if err := macSpoofRemove(ctx, fw, a); err != nil {
			t.Fatal(err)
		}
	}
	if names, _ := fw.Tables(ctx, ruleset.Bridge); len(names) != 2 {
		t.Fatalf("tables after DEL: %v", names)
	}
	if err := macSpoofCollect(ctx, fw, "mwtb", nil); err != nil {
		t.Fatal(err)
	}
	if names, _ := fw.Tables(ctx, ruleset.Bridge); len(names) != 1 || names[0] != foreign.MacSpoofTable() {
		t.Fatalf("tables after GC: %v", names)
	}
}

// TestMacSpoofScript: the table as an nft script is the one earlier
// versions applied with nft -f, byte for byte.
func TestMacSpoofScript(t *testing.T) {
	mac, _ := net.ParseMAC("0a:58:0a:f4:01:05")
	want := `add table bridge mw-ms-x
delete table bridge mw-ms-x
table bridge mw-ms-x {
	chain prerouting {
		type filter hook prerouting priority -300; policy accept;
		iifname "mw12345678" ether saddr != 0a:58:0a:f4:01:05 drop
	}
}
`
	if got := fwtext.NftReplaceTable(macSpoofTable("mw-ms-x", "mw12345678", mac)); got != want {
		t.Fatalf("script:\n%s\nwant:\n%s", got, want)
	}
}
