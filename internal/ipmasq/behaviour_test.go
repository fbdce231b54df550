package ipmasq

import (
	"context"
	"net"
	"testing"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwfake"
)

// TestBehaviour runs ADD, re-ADD, CHECK, DEL (twice) and GC of two
// attachments on each backend, through the in-memory firewall.
func TestBehaviour(t *testing.T) {
	backends := []firewall.Backend{
		{Kind: firewall.IPTables, Variant: firewall.VariantLegacy},
		{Kind: firewall.IPTables, Variant: firewall.VariantNFT},
		{Kind: firewall.NFTables},
	}
	addrs := []net.IPNet{cidr("198.18.16.5/24"), cidr("fd20:0:0:16::5/64")}
	other := attachment.ID{Network: att.Network, ContainerID: "ffff", IfName: "eth0"}
	otherAddrs := []net.IPNet{cidr("198.18.16.6/24")}
	foreign := attachment.ID{Network: "another-net", ContainerID: "eeee", IfName: "eth0"}
	for _, b := range backends {
		t.Run(b.String(), func(t *testing.T) {
			ctx := context.Background()
			fw := fwfake.New(b)
			present := func(a attachment.ID, ad []net.IPNet) bool {
				t.Helper()
				ok, err := Present(ctx, fw, a, ad)
				must(t, err)
				return ok
			}
			if present(att, addrs) {
				t.Fatal("CHECK passes before ADD")
			}
			must(t, Setup(ctx, fw, att, addrs))
			must(t, Setup(ctx, fw, other, otherAddrs))
			must(t, Setup(ctx, fw, foreign, otherAddrs))
			if !present(att, addrs) || !present(other, otherAddrs) {
				t.Fatalf("CHECK fails after ADD:\n%s", fw.Dump())
			}
			if b.Kind == firewall.IPTables && b.Variant == firewall.VariantNFT {
				// The first ADD made the nat tables with the tools, the
				// next ones appended over netlink.
				if ops := fw.Ops(); ops[0] != "restore v4, restore v6" || ops[len(ops)-1] != "netlink" {
					t.Fatalf("writes %v", ops)
				}
			}
			must(t, Teardown(ctx, fw, att, addrs))
			if present(att, addrs[:1]) || present(att, addrs[1:]) {
				t.Fatalf("rules left after DEL:\n%s", fw.Dump())
			}
			if !present(other, otherAddrs) {
				t.Fatal("DEL removed another attachment's rules")
			}
			// A second DEL, with or without addresses, is no error.
			must(t, Teardown(ctx, fw, att, addrs))
			must(t, Teardown(ctx, fw, att, nil))
			// A repeated ADD still checks, and a DEL that does not know
			// the addresses removes everything of the attachment (with
			// legacy iptables the repeated ADD doubled the rules; a DEL
			// with the addresses would remove one copy).
			must(t, Setup(ctx, fw, att, addrs))
			must(t, Setup(ctx, fw, att, addrs))
			if !present(att, addrs) {
				t.Fatal("CHECK fails after a repeated ADD")
			}
			must(t, Teardown(ctx, fw, att, nil))
			if present(att, addrs[:1]) || present(att, addrs[1:]) {
				t.Fatalf("rules left after DEL:\n%s", fw.Dump())
			}
			// GC keeps what is valid and what is another network's.
			must(t, Setup(ctx, fw, att, addrs))
			must(t, GC(ctx, fw, att.Network, []attachment.ID{{ContainerID: other.ContainerID, IfName: "eth0"}}))
			if present(att, addrs[:1]) || !present(other, otherAddrs) || !present(foreign, otherAddrs) {
				t.Fatalf("after GC:\n%s", fw.Dump())
			}
			must(t, GC(ctx, fw, att.Network, nil))
			if present(other, otherAddrs) || !present(foreign, otherAddrs) {
				t.Fatalf("after GC of everything:\n%s", fw.Dump())
			}
		})
	}
}

// TestSetupFailure: a refused transaction is an error.
func TestSetupFailure(t *testing.T) {
	fw := fwfake.New(firewall.Backend{Kind: firewall.NFTables})
	fw.Fail = func(string) error { return net.ErrClosed }
	if err := Setup(context.Background(), fw, att, []net.IPNet{cidr("198.18.16.5/24")}); err == nil {
		t.Fatal("Setup succeeded with the firewall refusing")
	}
}
