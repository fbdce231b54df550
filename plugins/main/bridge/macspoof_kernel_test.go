//go:build kernel

package main

import (
	"context"
	"fmt"
	"net"
	"testing"

	attid "github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// TestMacSpoofOverNetlink: the macspoof table is written over netlink with
// no firewall tool on PATH, and what the kernel holds is what `nft -f`
// makes of the table's script, statement for statement and expression for
// expression (nft --debug=netlink prints both); DEL removes it, still with
// no tool.
func TestMacSpoofOverNetlink(t *testing.T) {
	kerneltest.Require(t)
	ctx := context.Background()
	a := attid.ID{Network: "mwtb", ContainerID: "c1", IfName: "eth0"}
	mac, _ := net.ParseMAC("0a:58:0a:f4:01:05")
	script := fwtext.NftReplaceTable(macSpoofTable(a.MacSpoofTable(), "mw12345678", mac))
	byNetlink := kerneltest.SameAsNft(t, "ms", "bridge", a.MacSpoofTable(), script, func() error {
		fw := firewall.New(macSpoofBackend)
		defer fw.Close()
		for range 2 { // a repeated ADD replaces the table
			if err := macSpoofInstall(ctx, fw, a, "mw12345678", mac); err != nil {
				return err
			}
		}
		return nil
	})
	err := kerneltest.WithoutTools(t, func() error {
		return netns.Enter(byNetlink, func() error {
			fw := firewall.New(macSpoofBackend)
			defer fw.Close()
			if err := macSpoofRemove(ctx, fw, a); err != nil {
				return err
			}
			names, err := fw.Tables(ctx, ruleset.Bridge)
			if err != nil || len(names) != 0 {
				return fmt.Errorf("bridge tables after DEL: %v, %v", names, err)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}
