//go:build kernel

package refrules

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
)

// BenchmarkDelNothingThere is what DEL pays on a node without anything of
// the reference's: the cheap checks of DelMasq and DelPortmap, in a
// namespace whose nat tables exist in every form (legacy, iptables-nft) as
// on a node that ever used them, and in a fresh one.
//
//	go test -run '^$' -bench DelNothingThere ./internal/refrules/
func BenchmarkDelNothingThere(b *testing.B) {
	kerneltest.Require(b)
	r := attachment.Reference{Network: "mynet", ContainerID: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", IfName: "eth0"}
	for _, withNat := range []bool{false, true} {
		name, p := kerneltest.NewNS(b, fmt.Sprintf("refrules-bench-%v", withNat))
		if withNat {
			const nat = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n"
			for _, tool := range []string{"iptables-legacy-restore", "ip6tables-legacy-restore", "iptables-nft-restore", "ip6tables-nft-restore"} {
				cmd := exec.Command("ip", "netns", "exec", name, tool, "--noflush")
				cmd.Stdin = strings.NewReader(nat)
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("%s: %v: %s", tool, err, out)
				}
			}
		}
		label := map[bool]string{false: "fresh namespace", true: "nat tables of every form"}[withNat]
		for _, fn := range []struct {
			name string
			del  func(context.Context, *firewall.Host, attachment.Reference) error
		}{{"DelMasq", DelMasq}, {"DelPortmap", DelPortmap}} {
			b.Run(fn.name+"/"+label, func(b *testing.B) {
				err := netns.Enter(p, func() error {
					for i := 0; i < b.N; i++ {
						// As a plugin's DEL: the firewall it already has, closed once.
						fw := firewall.New(firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantNFT})
						err := fn.del(context.Background(), fw, r)
						fw.Close()
						if err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}
