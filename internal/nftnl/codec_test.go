package nftnl

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// rule is what the tests and the benchmark read of a rule: its handle,
// its comment (userdata, or a comment match) and its target (an xtables
// target's name, or MASQUERADE for a native masq); the benchmark's library
// side reads the same (libRule). Typed rules are internal/firewall's.
type rule struct {
	Handle          uint64
	Comment, Target string
}

func readRule(obj []byte) rule {
	var r rule
	EachAttr(obj, func(typ uint16, d []byte) {
		switch typ {
		case unix.NFTA_RULE_HANDLE:
			if len(d) == 8 {
				r.Handle = binary.BigEndian.Uint64(d)
			}
		case unix.NFTA_RULE_USERDATA:
			r.Comment = UserdataComment(d)
		case unix.NFTA_RULE_EXPRESSIONS:
			EachExpr(d, func(name, data []byte) {
				switch string(name) {
				case "masq":
					r.Target = "MASQUERADE"
				case "match", "target":
					var xname, info []byte
					EachAttr(data, func(typ uint16, d []byte) {
						switch typ {
						case unix.NFTA_MATCH_NAME: // NFTA_TARGET_NAME
							xname = CStr(d)
						case unix.NFTA_MATCH_INFO: // NFTA_TARGET_INFO
							info = d
						}
					})
					if string(name) == "target" {
						r.Target = string(xname)
					} else if string(xname) == "comment" {
						r.Comment = string(CStr(info))
					}
				}
			})
		}
	})
	return r
}

// FuzzParseRule: the parsers of kernel messages (EachAttr, EachExpr,
// UserdataComment, CStr, as readRule puts them together) must not panic
// whatever the bytes, and report nothing that is not in the message.
func FuzzParseRule(f *testing.F) {
	c := &Conn{}
	msg, _ := c.appendMsg(nil, nftType(unix.NFT_MSG_NEWRULE), 0, unix.NFPROTO_IPV4, 0,
		Attr{unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, 42)},
		Attr{unix.NFTA_RULE_USERDATA, append([]byte{0, 4}, "hi\x00\x00"...)})
	f.Add(msg[unix.NLMSG_HDRLEN+4:])
	f.Add([]byte{})
	f.Add([]byte{8, 0, 7, 0, 1, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := readRule(b)
		// Nothing is invented: a handle, comment and target all come from
		// bytes of the message.
		if r.Handle != 0 && !bytes.Contains(b, binary.BigEndian.AppendUint64(nil, r.Handle)) {
			t.Fatalf("handle %d is not in the message", r.Handle)
		}
		for _, s := range []string{r.Comment, r.Target} {
			if s != "" && s != "MASQUERADE" && !bytes.Contains(b, []byte(s)) {
				t.Fatalf("%q is not in the message", s)
			}
		}
	})
}

func TestParseRuleBuilt(t *testing.T) {
	c := &Conn{}
	msg, _ := c.appendMsg(nil, nftType(unix.NFT_MSG_NEWRULE), 0, unix.NFPROTO_IPV4, 0,
		Attr{unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, 42)},
		Attr{unix.NFTA_RULE_USERDATA, append([]byte{0, 4}, "hi\x00\x00"...)})
	r := readRule(msg[unix.NLMSG_HDRLEN+4:])
	if r.Handle != 42 || r.Comment != "hi" {
		t.Fatalf("parsed %+v", r)
	}
}

// TestEncodeExprs: EachExpr reads back the expressions EncodeExprs wrote,
// in order.
func TestEncodeExprs(t *testing.T) {
	cm, err := Comment("hello")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	EachExpr(EncodeExprs([]Expr{NotMulticastDst(), cm, Counter(), Masquerade(IP6)}), func(name, data []byte) {
		var x string
		EachAttr(data, func(typ uint16, d []byte) {
			if typ == unix.NFTA_MATCH_NAME { // NFTA_TARGET_NAME
				x = "/" + string(CStr(d))
			}
		})
		names = append(names, string(name)+x)
	})
	if got := strings.Join(names, " "); got != "match/addrtype match/comment counter target/MASQUERADE" {
		t.Fatalf("read back %q", got)
	}
	if _, err := Comment(strings.Repeat("x", 256)); err == nil {
		t.Fatal("a comment of 256 bytes was encoded")
	}
}
