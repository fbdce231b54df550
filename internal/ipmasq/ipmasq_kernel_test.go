//go:build kernel

package ipmasq

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// TestSetupOverNetlinkIsTheIPTablesRuleset: on iptables-nft, Setup writes
// over netlink (once the nat table exists) exactly the rules AddTx
// describes, as iptables-save prints them; Present sees them and Teardown
// removes them, leaving another attachment's.
func TestSetupOverNetlinkIsTheIPTablesRuleset(t *testing.T) {
	kerneltest.Require(t)
	_, p := kerneltest.NewNS(t, "masq")
	b := firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantNFT}
	ctx := context.Background()
	addrs := []net.IPNet{cidr("198.18.16.5/24"), cidr("198.18.17.5/20"), cidr("fd20:0:0:16::5/64")}
	other := attachment.ID{Network: att.Network, ContainerID: "ffff", IfName: "eth0"}
	err := netns.Enter(p, func() error {
		// The first Setup finds no nat table and uses the tools, which
		// make it; the second goes over netlink.
		fw := firewall.New(b)
		err := Setup(ctx, fw, other, []net.IPNet{cidr("198.18.16.6/24"), cidr("fd20:0:0:16::6/64")})
		if tail := fw.Release(); err != nil || tail != nil {
			return fmt.Errorf("first Setup: %v, %v (want the tools, no socket)", tail, err)
		}
		fw = firewall.New(b)
		err = Setup(ctx, fw, att, addrs)
		tail := fw.Release()
		if err != nil || tail == nil {
			return fmt.Errorf("Setup over netlink: %v, %v", tail, err)
		}
		tail.Close()
		fw = firewall.New(b)
		defer fw.Release()
		v4, v6 := split(addrs)
		for _, fam := range []struct {
			f     ruleset.IPVersion
			addrs []net.IPNet
		}{{ruleset.V4, v4}, {ruleset.V6, v6}} {
			save, err := b.Save(ctx, fam.f, "nat")
			if err != nil {
				return err
			}
			want := strings.TrimSuffix(strings.TrimPrefix(fwtext.Text(AddTx(att, fam.addrs), false), "*nat\n"), "COMMIT\n")
			if !strings.Contains(save, want) {
				return fmt.Errorf("IPv%d: iptables-save\n%s\ndoes not hold\n%s", fam.f, save, want)
			}
		}
		if ok, err := Present(ctx, fw, att, addrs); !ok || err != nil {
			return fmt.Errorf("Present = %v, %v", ok, err)
		}
		if err := Teardown(ctx, fw, att, nil); err != nil {
			return err
		}
		if ok, _ := Present(ctx, fw, att, addrs[:1]); ok {
			return fmt.Errorf("rules left after Teardown")
		}
		if ok, _ := Present(ctx, fw, other, []net.IPNet{cidr("198.18.16.6/24"), cidr("fd20:0:0:16::6/64")}); !ok {
			return fmt.Errorf("Teardown removed another attachment's rules")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestNftablesSetupNeedsNoTool: with native nftables, Setup writes the
// attachment's table over netlink with no firewall tool on PATH, and what
// it writes is what `nft -f` makes of NftAdd's script, statement for
// statement and expression for expression (nft --debug=netlink prints
// both); Present sees it and Teardown removes it, still with no tool.
func TestNftablesSetupNeedsNoTool(t *testing.T) {
	kerneltest.Require(t)
	addrs := []net.IPNet{cidr("198.18.16.5/24"), cidr("198.18.17.5/20"), cidr("fd20:0:0:16::5/64")}
	ctx := context.Background()
	b := firewall.Backend{Kind: firewall.NFTables}
	byNetlink := kerneltest.SameAsNft(t, "masq", "inet", att.MasqTable(), NftAdd(att, addrs), func() error {
		fw := firewall.New(b)
		defer fw.Close()
		// Twice: the second replaces the first.
		for i := 0; i < 2; i++ {
			if err := Setup(ctx, fw, att, addrs); err != nil {
				return fmt.Errorf("Setup %d: %w", i+1, err)
			}
		}
		if ok, err := Present(ctx, fw, att, addrs); !ok || err != nil {
			return fmt.Errorf("Present = %v, %v", ok, err)
		}
		return nil
	})
	err := kerneltest.WithoutTools(t, func() error {
		return netns.Enter(byNetlink, func() error {
			fw := firewall.New(b)
			defer fw.Close()
			if err := Teardown(ctx, fw, att, addrs); err != nil {
				return err
			}
			if ok, err := Present(ctx, fw, att, addrs); ok || err != nil {
				return fmt.Errorf("after Teardown: Present = %v, %v", ok, err)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}
