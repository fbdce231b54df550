package nftnl

import (
	"encoding/binary"
	"fmt"
	"net"
	"slices"

	"golang.org/x/sys/unix"
)

// Writing iptables-nft rules over netlink. A rule is appended with exactly
// the expressions iptables-nft itself would generate for the same
// iptables-restore line (the tests compare the two byte for byte, and
// iptables-save prints both the same way), so that iptables-nft, and the
// people reading its output, see an ordinary rule. Only the few shapes
// meshwire writes are covered: address matches, the comment and addrtype
// matches, the MASQUERADE target, and a counter.

// Expr is one expression of a rule written over netlink.
type Expr struct {
	name string
	data []Attr
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// nested encodes attributes as the payload of a nested attribute.
func nested(attrs ...Attr) []byte {
	var b []byte
	for _, a := range attrs {
		b = appendAttr(b, a)
	}
	return b
}

func appendAttr(b []byte, a Attr) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+len(a.Data)))
	b = binary.NativeEndian.AppendUint16(b, a.Type)
	b = append(b, a.Data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func nest(typ uint16, attrs ...Attr) Attr {
	return Attr{typ | unix.NLA_F_NESTED, nested(attrs...)}
}

// AddrMatch matches the source (or destination) address of the packet
// against n, as iptables-nft encodes `[!] -s n`: the prefix's whole bytes are
// loaded and compared; a prefix that does not end on a byte boundary loads
// the whole address and masks it first.
func AddrMatch(f Family, dst, invert bool, n net.IPNet) []Expr {
	offset, mask, value := addrLoad(f, dst, n)
	length := len(value)
	op := uint32(unix.NFT_CMP_EQ)
	if invert {
		op = unix.NFT_CMP_NEQ
	}
	exprs := []Expr{{"payload", []Attr{
		{unix.NFTA_PAYLOAD_DREG, be32(unix.NFT_REG_1)},
		{unix.NFTA_PAYLOAD_BASE, be32(unix.NFT_PAYLOAD_NETWORK_HEADER)},
		{unix.NFTA_PAYLOAD_OFFSET, be32(offset)},
		{unix.NFTA_PAYLOAD_LEN, be32(uint32(length))},
	}}}
	if mask != nil {
		exprs = append(exprs, Expr{"bitwise", []Attr{
			{unix.NFTA_BITWISE_SREG, be32(unix.NFT_REG_1)},
			{unix.NFTA_BITWISE_DREG, be32(unix.NFT_REG_1)},
			{unix.NFTA_BITWISE_LEN, be32(uint32(length))},
			nest(unix.NFTA_BITWISE_MASK, Attr{unix.NFTA_DATA_VALUE, mask}),
			nest(unix.NFTA_BITWISE_XOR, Attr{unix.NFTA_DATA_VALUE, make([]byte, length)}),
		}})
	}
	return append(exprs, Expr{"cmp", []Attr{
		{unix.NFTA_CMP_SREG, be32(unix.NFT_REG_1)},
		{unix.NFTA_CMP_OP, be32(op)},
		nest(unix.NFTA_CMP_DATA, Attr{unix.NFTA_DATA_VALUE, value}),
	}})
}

// addrLoad is what AddrMatch loads and compares for n: the payload offset
// of the address, the mask to apply when the prefix does not end on a byte
// boundary (nil when it does), and the value to compare, whose length is
// how many bytes are loaded (the prefix's whole bytes, or the whole address
// when masked).
func addrLoad(f Family, dst bool, n net.IPNet) (offset uint32, mask, value []byte) {
	ip, m := n.IP.To4(), []byte(n.Mask)
	offset = 12 // IPv4 saddr
	if f == IP6 {
		ip, offset = n.IP.To16(), 8
	}
	if dst {
		offset += uint32(len(ip))
	}
	if len(m) > len(ip) {
		m = m[len(m)-len(ip):]
	}
	full := 0
	for full < len(m) && m[full] == 0xff {
		full++
	}
	length := full
	if slices.ContainsFunc(m[full:], func(b byte) bool { return b != 0 }) {
		length, mask = len(ip), m
	}
	value = make([]byte, length)
	for i := range value {
		value[i] = ip[i] & m[i]
	}
	return offset, mask, value
}

// xtMatch is an xtables match (`-m name`) with its revision and info blob.
func xtMatch(name string, rev uint32, info []byte) Expr {
	return Expr{"match", []Attr{StrAttr(unix.NFTA_MATCH_NAME, name), {unix.NFTA_MATCH_REV, be32(rev)}, {unix.NFTA_MATCH_INFO, info}}}
}

// xtTarget is an xtables target (`-j name`) with its revision and info blob.
func xtTarget(name string, rev uint32, info []byte) Expr {
	return Expr{"target", []Attr{StrAttr(unix.NFTA_TARGET_NAME, name), {unix.NFTA_TARGET_REV, be32(rev)}, {unix.NFTA_TARGET_INFO, info}}}
}

// Counter is the packet and byte counter iptables-nft puts in every rule.
func Counter() Expr { return Expr{name: "counter"} }

// Comment is `-m comment --comment text` (at most 255 bytes).
func Comment(text string) (Expr, error) {
	const size = 256 // XT_MAX_COMMENT_LEN, with the NUL
	if len(text) >= size {
		return Expr{}, fmt.Errorf("comment of %d bytes, the limit is %d", len(text), size-1)
	}
	info := make([]byte, size)
	copy(info, text)
	return xtMatch("comment", 0, info), nil
}

// NotMulticastDst is `-m addrtype ! --dst-type MULTICAST` (revision 1:
// struct xt_addrtype_info_v1 { u16 source, dest; u32 flags }).
func NotMulticastDst() Expr {
	info := make([]byte, 8)
	binary.NativeEndian.PutUint16(info[2:], 1<<unix.RTN_MULTICAST)
	binary.NativeEndian.PutUint32(info[4:], 0x2) // XT_ADDRTYPE_INVERT_DEST
	return xtMatch("addrtype", 1, info)
}

// Masquerade is `-j MASQUERADE`: for IPv4 its info is
// nf_nat_ipv4_multi_range_compat with one empty range (24 bytes aligned),
// for IPv6 an empty nf_nat_range (40 bytes).
func Masquerade(f Family) Expr {
	if f == IP6 {
		return xtTarget("MASQUERADE", 0, make([]byte, 40))
	}
	info := make([]byte, 24)
	binary.NativeEndian.PutUint32(info, 1) // rangesize
	return xtTarget("MASQUERADE", 0, info)
}

// NewRule is a rule to append: its family (IP or IP6 for iptables-nft),
// table, chain and expressions.
type NewRule struct {
	Family Family
	Table  string
	Chain  string
	Exprs  []Expr
}

// EncodeExprs encodes expressions as the NFTA_RULE_EXPRESSIONS list that
// AppendRules sends (and a read of the rule returns).
func EncodeExprs(exprs []Expr) []byte {
	var list []byte
	for _, e := range exprs {
		list = appendAttr(list, nest(unix.NFTA_LIST_ELEM, StrAttr(unix.NFTA_EXPR_NAME, e.name), nest(unix.NFTA_EXPR_DATA, e.data...)))
	}
	return list
}

// AppendRules appends rules to their chains in one transaction. A table or
// chain that is not there fails it (with ENOENT): iptables-nft creates those
// with its own attributes, so the caller then uses the tools.
func (c *Conn) AppendRules(rules []NewRule) error {
	err := c.batch(func(b []byte) []byte {
		for _, r := range rules {
			b, _ = c.appendMsg(b, nftType(unix.NFT_MSG_NEWRULE), unix.NLM_F_REQUEST|unix.NLM_F_CREATE|unix.NLM_F_APPEND, r.Family, 0,
				StrAttr(unix.NFTA_RULE_TABLE, r.Table), StrAttr(unix.NFTA_RULE_CHAIN, r.Chain),
				Attr{unix.NFTA_RULE_EXPRESSIONS | unix.NLA_F_NESTED, EncodeExprs(r.Exprs)})
		}
		return b
	})
	if err == nil {
		c.committed = true
	}
	return err
}

// Native nftables rules (an inet table of meshwire's own, not iptables-nft's)
// use nft's expressions for the same statements: `meta nfproto` before an
// ip or ip6 match, no counter or comment match, and nft's own masquerade.
// nft encodes `ip saddr/daddr [!=] prefix` exactly as AddrMatch does (the
// tests compare with what `nft -f` makes of the same script).

// MetaNfproto is `meta nfproto ipv4` (ipv6 for IP6): the dependency nft
// puts before an address match in an inet table.
func MetaNfproto(f Family) []Expr {
	v := byte(unix.NFPROTO_IPV4)
	if f == IP6 {
		v = unix.NFPROTO_IPV6
	}
	return []Expr{
		{"meta", []Attr{{unix.NFTA_META_KEY, be32(unix.NFT_META_NFPROTO)}, {unix.NFTA_META_DREG, be32(unix.NFT_REG_1)}}},
		{"cmp", []Attr{
			{unix.NFTA_CMP_SREG, be32(unix.NFT_REG_1)},
			{unix.NFTA_CMP_OP, be32(unix.NFT_CMP_EQ)},
			nest(unix.NFTA_CMP_DATA, Attr{unix.NFTA_DATA_VALUE, []byte{v}}),
		}},
	}
}

// Masq is nft's `masquerade` statement.
func Masq() Expr { return Expr{name: "masq"} }

// IfnameMatch is nft's `iifname [!=] "name"` (oifname with out): the name
// loaded with meta and compared padded to IFNAMSIZ, as nft compares it.
func IfnameMatch(out, invert bool, name string) []Expr {
	key, op := uint32(unix.NFT_META_IIFNAME), uint32(unix.NFT_CMP_EQ)
	if out {
		key = unix.NFT_META_OIFNAME
	}
	if invert {
		op = unix.NFT_CMP_NEQ
	}
	v := make([]byte, unix.IFNAMSIZ)
	copy(v, name)
	return []Expr{
		{"meta", []Attr{{unix.NFTA_META_KEY, be32(key)}, {unix.NFTA_META_DREG, be32(unix.NFT_REG_1)}}},
		{"cmp", []Attr{
			{unix.NFTA_CMP_SREG, be32(unix.NFT_REG_1)},
			{unix.NFTA_CMP_OP, be32(op)},
			nest(unix.NFTA_CMP_DATA, Attr{unix.NFTA_DATA_VALUE, v}),
		}},
	}
}

// EtherSrcMatch is nft's `ether saddr [!=] mac` in a bridge table: six
// bytes at offset 6 of the link-layer header.
func EtherSrcMatch(invert bool, mac net.HardwareAddr) []Expr {
	op := uint32(unix.NFT_CMP_EQ)
	if invert {
		op = unix.NFT_CMP_NEQ
	}
	return []Expr{
		{"payload", []Attr{
			{unix.NFTA_PAYLOAD_DREG, be32(unix.NFT_REG_1)},
			{unix.NFTA_PAYLOAD_BASE, be32(unix.NFT_PAYLOAD_LL_HEADER)},
			{unix.NFTA_PAYLOAD_OFFSET, be32(6)},
			{unix.NFTA_PAYLOAD_LEN, be32(uint32(len(mac)))},
		}},
		{"cmp", []Attr{
			{unix.NFTA_CMP_SREG, be32(unix.NFT_REG_1)},
			{unix.NFTA_CMP_OP, be32(op)},
			nest(unix.NFTA_CMP_DATA, Attr{unix.NFTA_DATA_VALUE, []byte(mac)}),
		}},
	}
}

// Verdict is nft's `accept` or `drop` (NF_ACCEPT, NF_DROP) as a rule's
// last statement.
func Verdict(code uint32) Expr {
	return Expr{"immediate", []Attr{
		{unix.NFTA_IMMEDIATE_DREG, be32(unix.NFT_REG_VERDICT)},
		nest(unix.NFTA_IMMEDIATE_DATA, nest(unix.NFTA_DATA_VERDICT, Attr{unix.NFTA_VERDICT_CODE, be32(code)})),
	}}
}
