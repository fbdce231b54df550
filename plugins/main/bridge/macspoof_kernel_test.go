//go:build kernel

package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	attid "github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
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
	list := func(p string) string {
		t.Helper()
		out, err := exec.Command("ip", "netns", "exec", filepath.Base(p), "nft", "--debug=netlink", "list", "table", "bridge", a.MacSpoofTable()).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list: %v: %s", err, out)
		}
		return string(out)
	}
	_, byTool := kerneltest.NewNS(t, "msnt")
	_, byNetlink := kerneltest.NewNS(t, "msnn")
	cmd := exec.Command("ip", "netns", "exec", filepath.Base(byTool), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(macSpoofTable(a.MacSpoofTable(), "mw12345678", mac).Script())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v: %s", err, out)
	}
	path := os.Getenv("PATH")
	t.Setenv("PATH", t.TempDir()) // no tool can run
	err := netns.Enter(byNetlink, func() error {
		fw := firewall.New(macSpoofBackend)
		defer fw.Close()
		for range 2 { // a repeated ADD replaces the table
			if err := macSpoofInstall(ctx, fw, a, "mw12345678", mac); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", path)
	if want, got := list(byTool), list(byNetlink); want != got {
		t.Fatalf("over netlink:\n%s\nnft -f of the script:\n%s", got, want)
	}
	t.Setenv("PATH", t.TempDir())
	err = netns.Enter(byNetlink, func() error {
		fw := firewall.New(macSpoofBackend)
		defer fw.Close()
		if err := macSpoofRemove(ctx, fw, a); err != nil {
			return err
		}
		names, err := fw.Tables(ctx, firewall.Bridge)
		if err != nil || len(names) != 0 {
			t.Errorf("bridge tables after DEL: %v, %v", names, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
