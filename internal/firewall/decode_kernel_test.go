//go:build kernel

package firewall

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
)

// TestReadsMatchTheFake: a script applied to the kernel and read back over
// netlink gives the typed rules the Fake reads from the same script (the
// decoder and the Fake's parser agree), for a native table and for
// iptables-nft rules.
func TestReadsMatchTheFake(t *testing.T) {
	kerneltest.Require(t)
	_, p := kerneltest.NewNS(t, "fwdec")
	ctx := context.Background()
	script := `table inet mwt {
	comment "a table"
	chain pm-1 {
		comment "an attachment"
		meta nfproto ipv4 ip saddr != 198.18.49.0/24 tcp dport 30080 dnat ip to 198.18.48.5:80
		meta nfproto ipv6 ip6 daddr fd50:48::1 tcp dport 30080 dnat ip6 to [fd50:48::5]:80
	}
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		fib daddr type local jump pm-1
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		meta mark & 0x00002000 == 0x00002000 masquerade
	}
}
table ip mwt {
	chain mangle {
		type filter hook prerouting priority -150; policy accept;
		meta l4proto tcp iifname "eth0" meta mark set 0x00000001 tproxy to :15006 accept
	}
	chain nat_output {
		type nat hook output priority -100; policy accept;
		ip daddr 10.0.0.0/8 return
		tcp dport != 22 redirect to :15001
	}
}
`
	restore := "*nat\n:MWT - [0:0]\n-A POSTROUTING -s 10.1.0.2/32 ! -d 10.1.0.0/24 -m comment --comment \"hello world\" -j MASQUERADE\n" +
		"-A PREROUTING -m addrtype --dst-type LOCAL -j MWT\n-A MWT -d 10.0.0.1/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.1.0.2:80\nCOMMIT\n"
	nftB, iptB := Backend{Kind: NFTables}, Backend{Kind: IPTables, Variant: VariantNFT}
	fake, fakeIPT := NewFake(nftB), NewFake(iptB)
	if err := fake.ApplyNft(ctx, script); err != nil {
		t.Fatal(err)
	}
	if err := fakeIPT.Restore(ctx, V4, restore); err != nil {
		t.Fatal(err)
	}
	err := netns.Enter(p, func() error {
		h := New(nftB)
		defer h.Close()
		if err := h.ApplyNft(ctx, script); err != nil {
			return err
		}
		if err := New(iptB).Restore(ctx, V4, restore); err != nil {
			return err
		}
		for _, c := range []struct {
			fam   TableFamily
			table string
			fake  *Fake
		}{{Inet, "mwt", fake}, {IP, "mwt", fake}, {IP, "nat", fakeIPT}} {
			got, err := h.ReadTable(ctx, c.fam, c.table)
			if err != nil {
				return err
			}
			want := c.fake.Table(c.fam, c.table)
			if got == nil || got.Comment != want.Comment {
				return fmt.Errorf("%s %s: table %+v, want %+v", c.fam.Name(), c.table, got, want)
			}
			for _, wc := range want.Chains {
				gc := got.Chain(wc.Name)
				if gc == nil && wc.Hook != "" && len(wc.Rules) == 0 {
					continue // iptables-nft makes built-in chains when used
				}
				if gc == nil || gc.Comment != wc.Comment || gc.Hook != wc.Hook || len(gc.Rules) != len(wc.Rules) {
					return fmt.Errorf("chain %s: %+v, want %+v", wc.Name, gc, wc)
				}
				for i, wr := range wc.Rules {
					gr := gc.Rules[i]
					if gr.Handle == 0 {
						return fmt.Errorf("rule without a handle: %+v", gr)
					}
					gr.Handle, wr.Handle = 0, 0
					if gr != wr {
						return fmt.Errorf("chain %s rule %d:\n got %+v\nwant %+v", wc.Name, i+1, gr, wr)
					}
				}
			}
			names, err := h.ChainNames(ctx, c.fam, c.table)
			fakeNames, _ := c.fake.ChainNames(ctx, c.fam, c.table)
			for _, n := range fakeNames {
				if !slices.Contains(names, n) && (want.Chain(n).Hook == "" || len(want.Chain(n).Rules) > 0) {
					return fmt.Errorf("ChainNames %s %s = %v, %v; the Fake has %v", c.fam.Name(), c.table, names, err, fakeNames)
				}
			}
			if c.table == "mwt" && !slices.Equal(names, fakeNames) {
				return fmt.Errorf("ChainNames %s %s = %v, the Fake has %v", c.fam.Name(), c.table, names, fakeNames)
			}
			one, err := h.ReadChain(ctx, c.fam, c.table, want.Chains[0].Name)
			if err != nil || one == nil || len(one.Rules) != len(want.Chains[0].Rules) {
				return fmt.Errorf("ReadChain: %+v, %v", one, err)
			}
		}
		if ok, err := h.HasChain(ctx, IP, "nat", "MWT"); !ok || err != nil {
			return fmt.Errorf("HasChain = %v, %v", ok, err)
		}
		if c, err := h.ReadChain(ctx, IP, "nat", "ABSENT"); c != nil || err != nil {
			return fmt.Errorf("ReadChain of an absent chain = %+v, %v", c, err)
		}
		if names, err := h.ChainNames(ctx, Inet, "absent"); names != nil || err != nil {
			return fmt.Errorf("ChainNames of an absent table = %v, %v", names, err)
		}
		if ok, err := h.HasTable(ctx, Inet, "absent"); ok || err != nil {
			return fmt.Errorf("HasTable of an absent table = %v, %v", ok, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
