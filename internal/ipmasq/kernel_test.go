package ipmasq

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/netns"
)

// TestSetupOverNetlinkIsTheIPTablesRuleset: on iptables-nft, Setup writes
// over netlink (once the nat table exists) exactly the rules IPTablesAdd
// describes, as iptables-save prints them; Present sees them and Teardown
// removes them, leaving another attachment's.
func TestSetupOverNetlinkIsTheIPTablesRuleset(t *testing.T) {
	name := fmt.Sprintf("mwt-masq-%d", os.Getpid())
	p, err := netns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = netns.Delete(name) }()
	b := firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantNFT}
	ctx := context.Background()
	addrs := []net.IPNet{cidr("198.18.16.5/24"), cidr("198.18.17.5/20"), cidr("fd20:0:0:16::5/64")}
	other := Attachment{Network: att.Network, ContainerID: "ffff", IfName: "eth0"}
	err = netns.Enter(p, func() error {
		// The first Setup finds no nat table and uses the tools, which
		// make it; the second goes over netlink.
		tail, err := Setup(ctx, b, other, []net.IPNet{cidr("198.18.16.6/24"), cidr("fd20:0:0:16::6/64")})
		if err != nil || tail != nil {
			return fmt.Errorf("first Setup: %v, %v (want the tools, no socket)", tail, err)
		}
		tail, err = Setup(ctx, b, att, addrs)
		if err != nil || tail == nil {
			return fmt.Errorf("Setup over netlink: %v, %v", tail, err)
		}
		tail.Close()
		v4, v6 := split(addrs)
		for _, fam := range []struct {
			f     firewall.Family
			addrs []net.IPNet
		}{{firewall.V4, v4}, {firewall.V6, v6}} {
			save, err := b.Save(ctx, fam.f, "nat")
			if err != nil {
				return err
			}
			want := strings.TrimSuffix(strings.TrimPrefix(IPTablesAdd(att, fam.addrs), "*nat\n"), "COMMIT\n")
			if !strings.Contains(save, want) {
				return fmt.Errorf("IPv%d: iptables-save\n%s\ndoes not hold\n%s", fam.f, save, want)
			}
		}
		if ok, err := Present(ctx, b, att, addrs); !ok || err != nil {
			return fmt.Errorf("Present = %v, %v", ok, err)
		}
		tail, err = Teardown(ctx, b, att, nil)
		if tail != nil {
			tail.Close()
		}
		if err != nil {
			return err
		}
		if ok, _ := Present(ctx, b, att, addrs[:1]); ok {
			return fmt.Errorf("rules left after Teardown")
		}
		if ok, _ := Present(ctx, b, other, []net.IPNet{cidr("198.18.16.6/24"), cidr("fd20:0:0:16::6/64")}); !ok {
			return fmt.Errorf("Teardown removed another attachment's rules")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
