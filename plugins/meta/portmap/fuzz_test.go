package main

import (
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
)

// FuzzConfig feeds arbitrary stdin to the config parser and, when it is
// accepted, to the planner and every renderer: no panic, errors are CNI
// errors with codes 6 or 7, and what gets rendered never carries a line
// break or a command separator from the input into the payload.
func FuzzConfig(f *testing.F) {
	for _, gc := range goldenCases {
		f.Add(`{"cniVersion":"1.1.0","name":"n","type":"portmap",` + gc.conf + `}`)
	}
	f.Add(`{"cniVersion":"1.1.0","name":"n","type":"portmap","conditionsV4":["-s","1.2.3.4\n-A INPUT -j DROP"]}`)
	f.Add(`{"cniVersion":"1.1.0","name":"n","type":"portmap","runtimeConfig":{"portMappings":[{"hostPort":1,"containerPort":65535,"protocol":"SCTP","hostIP":"::ffff:1.2.3.4"}]}}`)
	f.Add(`{"cniVersion":"1.1.0","name":"n\"x","type":"portmap","markMasqBit":31}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, stdin string) {
		c, err := parseConfig([]byte(stdin))
		if err != nil {
			e, ok := err.(*types.Error)
			if !ok || (e.Code != 6 && e.Code != 7) {
				t.Fatalf("error %v is not a CNI error with code 6 or 7", err)
			}
			return
		}
		a := attachment.ID{ContainerID: "c", IfName: "eth0", Network: c.raw.Name}
		v4 := &net.IPNet{IP: net.ParseIP("198.18.48.5").To4(), Mask: net.CIDRMask(24, 32)}
		v6 := &net.IPNet{IP: net.ParseIP("fd50:48::5"), Mask: net.CIDRMask(64, 128)}
		plans := plan(c, a, v4, v6)
		nft := fwtext.Text(renderNFTAddNew(a, plans), true)
		if got, want := strings.Count(nft, "\n"), strings.Count(fwtext.Text(renderNFTEnsure(nil, a, plans), true), "\n"); got > want {
			t.Fatalf("fast path has more lines than the slow path:\n%s", nft)
		}
		lines := 1 // the tag
		for _, p := range plans {
			lines += len(p.Rules)
			payload := fwtext.Text(renderIPTAddNew(p), false)
			// *nat, -N, tag, rules, jump, COMMIT
			if n := strings.Count(payload, "\n"); n != len(p.Rules)+5 {
				t.Fatalf("iptables payload has %d lines for %d rules:\n%s", n, len(p.Rules), payload)
			}
		}
		// create chain, anchor, rules, jump
		if len(plans) > 0 && strings.Count(nft, "\n") != lines+2 {
			t.Fatalf("nft script has %d lines for %d rules:\n%s", strings.Count(nft, "\n"), lines-1, nft)
		}
		if strings.Contains(nft, ";") && strings.Count(nft, ";") != 1 {
			t.Fatalf("a ';' beyond the chain declaration:\n%s", nft)
		}
	})
}
