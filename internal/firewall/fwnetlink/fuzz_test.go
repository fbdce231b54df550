package fwnetlink

import (
	"bytes"
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/nftnl"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// A fuzz target of the decoder that reads nf_tables rules over netlink:
// whatever the input, it may not panic or report what is not in it. The
// seeds under testdata/fuzz are real: rules as the kernel dumps them
// (iptables-nft's and native nftables', every family), plus what fuzzing
// found.
//
//	go test -run '^$' -fuzz FuzzDecodeRule -fuzztime 60s ./internal/firewall/fwnetlink/

// FuzzDecodeRule: a rule's netlink attributes (as a dump passes them)
// decode, in every family, into a rule whose names, comment and handle
// come from the message.
func FuzzDecodeRule(f *testing.F) {
	f.Add([]byte{})
	cm, _ := nftnl.Comment("hi")
	exprs := nftnl.EncodeExprs([]nftnl.Expr{nftnl.NotMulticastDst(), cm, nftnl.Counter(), nftnl.Masquerade(ruleset.IP)})
	f.Add(ruleAttrs(exprs))
	// The xtables matches and targets decoded, with info blobs of the
	// sizes the kernel's structs have (and one byte short of them).
	for _, x := range []struct {
		kind, name string
		rev        uint32
		size       int
	}{
		{"match", "tcp", 0, 12}, {"match", "udp", 0, 10}, {"match", "tcp", 0, 8}, {"match", "udp", 0, 8},
		{"match", "addrtype", 1, 8}, {"match", "addrtype", 0, 12}, {"match", "mark", 1, 12}, {"match", "comment", 0, 256},
		{"target", "DNAT", 0, 20}, {"target", "DNAT", 2, 52}, {"target", "REDIRECT", 0, 20}, {"target", "TPROXY", 1, 28},
		{"target", "TPROXY", 0, 16}, {"target", "MARK", 2, 8},
	} {
		for _, size := range []int{x.size, x.size - 1} {
			info := bytes.Repeat([]byte{1}, size) // port ranges of one port
			nameT, revT, infoT := uint16(unix.NFTA_MATCH_NAME), uint16(unix.NFTA_MATCH_REV), uint16(unix.NFTA_MATCH_INFO)
			if x.kind == "target" {
				nameT, revT, infoT = unix.NFTA_TARGET_NAME, unix.NFTA_TARGET_REV, unix.NFTA_TARGET_INFO
			}
			data := appendAttrs(nil, nftnl.StrAttr(nameT, x.name), nftnl.Attr{Type: revT, Data: binary.BigEndian.AppendUint32(nil, x.rev)}, nftnl.Attr{Type: infoT, Data: info})
			elem := appendAttrs(nil, nftnl.StrAttr(unix.NFTA_EXPR_NAME, x.kind), nftnl.Attr{Type: unix.NFTA_EXPR_DATA | unix.NLA_F_NESTED, Data: data})
			f.Add(ruleAttrs(appendAttrs(nil, nftnl.Attr{Type: unix.NFTA_LIST_ELEM | unix.NLA_F_NESTED, Data: elem})))
		}
	}
	f.Fuzz(func(t *testing.T, obj []byte) {
		for _, fam := range []ruleset.Family{ruleset.IP, ruleset.IP6, ruleset.Inet, ruleset.Bridge} {
			r := decodeRule(fam, obj, nil)
			if r.Family != fam {
				t.Fatalf("family %s, want %s", r.Family, fam)
			}
			if r.Handle != 0 && !bytes.Contains(obj, binary.BigEndian.AppendUint64(nil, r.Handle)) {
				t.Fatalf("handle %d is not in the message", r.Handle)
			}
			for _, s := range []string{r.Table, r.Chain, r.Comment, r.Jump, r.In, r.Out} {
				if s != "" && !bytes.Contains(obj, []byte(s)) {
					t.Fatalf("%q is not in the message", s)
				}
			}
		}
	})
}

// appendAttrs appends netlink attributes (4-byte aligned) to b.
func appendAttrs(b []byte, attrs ...nftnl.Attr) []byte {
	for _, a := range attrs {
		b = binary.NativeEndian.AppendUint16(b, uint16(4+len(a.Data)))
		b = binary.NativeEndian.AppendUint16(b, a.Type)
		b = append(b, a.Data...)
		b = append(b, make([]byte, (4-len(a.Data)%4)%4)...)
	}
	return b
}

// ruleAttrs is a rule of nat POSTROUTING, handle 42, with the expression
// list exprs, as a dump passes it.
func ruleAttrs(exprs []byte) []byte {
	return appendAttrs(nil, nftnl.StrAttr(unix.NFTA_RULE_TABLE, "nat"), nftnl.StrAttr(unix.NFTA_RULE_CHAIN, "POSTROUTING"),
		nftnl.Attr{Type: unix.NFTA_RULE_HANDLE, Data: binary.BigEndian.AppendUint64(nil, 42)},
		nftnl.Attr{Type: unix.NFTA_RULE_EXPRESSIONS | unix.NLA_F_NESTED, Data: exprs})
}
