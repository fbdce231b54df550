//go:build kernel

package fwnetlink

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/nftnl"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// BenchmarkReadChain reads the nat POSTROUTING chain of an iptables-nft
// node holding the ipMasq rules of 100 and of 1,000 pods, which is what
// every bridge and veth CHECK and DEL with ipMasq does:
//
//	go test -tags kernel -run '^$' -bench ReadChain ./internal/firewall/fwnetlink/
//
// "decode" is the decoder alone, on the chain's rules as the kernel dumped
// them; "read" is ReadChain on an open connection (kernel dump included).
func BenchmarkReadChain(b *testing.B) {
	kerneltest.Require(b)
	for _, pods := range []int{100, 1000} {
		_, p := kerneltest.NewNS(b, fmt.Sprintf("fwread%d", pods))
		if err := benchReadChain(b, p, pods); err != nil {
			b.Fatal(err)
		}
	}
}

// benchReadChain loads the rules of pods in the namespace at nsPath and
// runs the two benchmarks there (a sub-benchmark runs on a goroutine of its
// own: each enters the namespace).
func benchReadChain(b *testing.B, nsPath string, pods int) error {
	ctx := context.Background()
	var payload strings.Builder
	payload.WriteString("*nat\n")
	for i := 0; i < pods; i++ {
		fmt.Fprintf(&payload, "-A POSTROUTING -s 10.%d.%d.%d/32 ! -d 10.%d.0.0/16 -m addrtype ! --dst-type MULTICAST -m comment --comment \"meshwire-masq MW-0123abcd-%011x net=bench id=%024x if=eth0\" -j MASQUERADE\n",
			i>>16, i>>8&0xff, i&0xff, i>>16, i, i)
	}
	payload.WriteString("COMMIT\n")
	var objs [][]byte
	err := netns.Enter(nsPath, func() error {
		restore := exec.CommandContext(ctx, "iptables-nft-restore", "--noflush")
		restore.Stdin = strings.NewReader(payload.String())
		if out, err := restore.CombinedOutput(); err != nil {
			return fmt.Errorf("iptables-nft-restore: %v: %s", err, out)
		}
		c, err := nftnl.Open()
		if err != nil {
			return err
		}
		defer c.Close()
		return c.Dump(unix.NFT_MSG_GETRULE, ruleset.IP, []nftnl.Attr{nftnl.StrAttr(unix.NFTA_RULE_TABLE, "nat"), nftnl.StrAttr(unix.NFTA_RULE_CHAIN, "POSTROUTING")},
			func() { objs = objs[:0] }, func(obj []byte) { objs = append(objs, append([]byte(nil), obj...)) })
	})
	if err != nil || len(objs) != pods {
		return fmt.Errorf("dumped %d rules of %d: %v", len(objs), pods, err)
	}
	if r := decodeRule(ruleset.IP, objs[0], nil); r.Target != "MASQUERADE" || r.Unknown != "" || !r.NotDstMulticast {
		return fmt.Errorf("decoded %+v", r)
	}
	b.Run(fmt.Sprintf("decode/%d", pods), func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			names := strs{}
			for _, o := range objs {
				decodeRule(ruleset.IP, o, names)
			}
		}
	})
	b.Run(fmt.Sprintf("read/%d", pods), func(b *testing.B) {
		err := netns.Enter(nsPath, func() error {
			c, err := nftnl.Open()
			if err != nil {
				return err
			}
			defer c.Close()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ch, err := ReadChain(c, ruleset.IP, "nat", "POSTROUTING")
				if err != nil || ch == nil || len(ch.Rules) != pods {
					return fmt.Errorf("read %v, want %d rules: %v", ch != nil, pods, err)
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	})
	return nil
}
