package fwnetlink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/nftnl"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// Typed reads over netlink (internal/nftnl): tables, chains and rules of
// nf_tables decoded into Table, Chain and Rule, for native nftables tables and for the
// tables of an nf_tables-backed iptables alike. The decoder knows the
// expressions meshwire's rules (and iptables-nft's encodings of them) are
// made of: payload and meta loads compared with cmp (addresses, ports,
// protocol, interfaces, marks), fib, the xtables matches and targets
// iptables-nft uses, immediate verdicts and the nat, masq, redir and
// tproxy statements. Anything else is named in Rule.Unknown.

// Attributes x/sys/unix does not name.
const (
	nftaTableUserdata = nftnl.TableUserdata
	nftaChainUserdata = 12 // NFTA_CHAIN_USERDATA
	nftaTproxyRegPort = 3  // NFTA_TPROXY_REG_PORT
	nftaNatRegAddrMin = unix.NFTA_NAT_REG_ADDR_MIN
	nfDrop            = 0 // NF_DROP
	nfAccept          = 1 // NF_ACCEPT
)

var hookNames = map[uint32]string{
	unix.NF_INET_PRE_ROUTING: "prerouting", unix.NF_INET_LOCAL_IN: "input", unix.NF_INET_FORWARD: "forward",
	unix.NF_INET_LOCAL_OUT: "output", unix.NF_INET_POST_ROUTING: "postrouting",
}

// readTable reads a table with its chains and their rules; nil when the
// table is not there.
func readTable(c *nftnl.Conn, fam ruleset.Family, name string) (*installed.Table, error) {
	t := &installed.Table{Family: fam, Name: name}
	err := c.Get(unix.NFT_MSG_GETTABLE, fam, []nftnl.Attr{nftnl.StrAttr(unix.NFTA_TABLE_NAME, name)}, func(obj []byte) {
		nftnl.EachAttr(obj, func(typ uint16, d []byte) {
			if typ == nftaTableUserdata {
				t.Comment = nftnl.UserdataComment(d)
			}
		})
	})
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nf_tables: read table %s %s: %w", fam.Name(), name, err)
	}
	var rules []installed.Rule
	err = c.Dump(unix.NFT_MSG_GETCHAIN, fam, []nftnl.Attr{nftnl.StrAttr(unix.NFTA_CHAIN_TABLE, name)},
		func() { t.Chains = t.Chains[:0] },
		func(obj []byte) {
			if ch := decodeChain(fam, obj); ch.Table == name {
				t.Chains = append(t.Chains, ch)
			}
		})
	if err == nil {
		rules, err = readRules(c, fam, name, "")
	}
	if errors.Is(err, unix.ENOENT) {
		return nil, nil // removed meanwhile
	}
	if err != nil {
		return nil, fmt.Errorf("nf_tables: read table %s %s: %w", fam.Name(), name, err)
	}
	for _, r := range rules {
		if ch := t.Chain(r.Chain); ch != nil {
			r.Position = len(ch.Rules) + 1
			ch.Rules = append(ch.Rules, r)
		}
	}
	return t, nil
}

// readChain reads one chain with its rules; nil when the chain (or its
// table) is not there.
func readChain(c *nftnl.Conn, fam ruleset.Family, table, chain string) (*installed.Chain, error) {
	var ch *installed.Chain
	err := c.Get(unix.NFT_MSG_GETCHAIN, fam, []nftnl.Attr{nftnl.StrAttr(unix.NFTA_CHAIN_TABLE, table), nftnl.StrAttr(unix.NFTA_CHAIN_NAME, chain)},
		func(obj []byte) { ch = decodeChain(fam, obj) })
	var rules []installed.Rule
	if err == nil {
		rules, err = readRules(c, fam, table, chain)
	}
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nf_tables: read chain %s %s %s: %w", fam.Name(), table, chain, err)
	}
	if ch == nil {
		return nil, nil
	}
	for i := range rules {
		rules[i].Position = i + 1
	}
	ch.Rules = rules
	return ch, nil
}

// hasTable tells whether a table is there (one request).
func hasTable(c *nftnl.Conn, fam ruleset.Family, name string) (bool, error) {
	err := c.Get(unix.NFT_MSG_GETTABLE, fam, []nftnl.Attr{nftnl.StrAttr(unix.NFTA_TABLE_NAME, name)}, func([]byte) {})
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	return err == nil, err
}

// hasChain tells whether a chain is there (one request).
func hasChain(c *nftnl.Conn, fam ruleset.Family, table, chain string) (bool, error) {
	err := c.Get(unix.NFT_MSG_GETCHAIN, fam, []nftnl.Attr{nftnl.StrAttr(unix.NFTA_CHAIN_TABLE, table), nftnl.StrAttr(unix.NFTA_CHAIN_NAME, chain)}, func([]byte) {})
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	return err == nil, err
}

// chainNames lists the chains of a table with one chain dump (the kernel
// dumps the family's chains; those of other tables are skipped); none when
// the table is not there.
func chainNames(c *nftnl.Conn, fam ruleset.Family, table string) ([]string, error) {
	var names []string
	err := c.Dump(unix.NFT_MSG_GETCHAIN, fam, []nftnl.Attr{nftnl.StrAttr(unix.NFTA_CHAIN_TABLE, table)},
		func() { names = names[:0] },
		func(obj []byte) {
			var t, n []byte
			nftnl.EachAttr(obj, func(typ uint16, d []byte) {
				switch typ {
				case unix.NFTA_CHAIN_TABLE:
					t = nftnl.CStr(d)
				case unix.NFTA_CHAIN_NAME:
					n = nftnl.CStr(d)
				}
			})
			if string(t) == table {
				names = append(names, string(n))
			}
		})
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nf_tables: list chains of %s %s: %w", fam.Name(), table, err)
	}
	if len(names) == 0 {
		return nil, nil
	}
	return names, nil
}

// readRules dumps the rules of a table, or of one of its chains.
func readRules(c *nftnl.Conn, fam ruleset.Family, table, chain string) ([]installed.Rule, error) {
	attrs := []nftnl.Attr{nftnl.StrAttr(unix.NFTA_RULE_TABLE, table)}
	if chain != "" {
		attrs = append(attrs, nftnl.StrAttr(unix.NFTA_RULE_CHAIN, chain))
	}
	var rules []installed.Rule
	names := strs{}
	err := c.Dump(unix.NFT_MSG_GETRULE, fam, attrs,
		func() { rules = rules[:0] },
		func(obj []byte) { rules = append(rules, decodeRule(fam, obj, names)) })
	return rules, err
}

// strs hands out one string per distinct text within a dump: the rules of
// a chain all name the same table and chain, and a busy node's nat
// POSTROUTING holds a rule per pod.
type strs map[string]string

func (m strs) of(b []byte) string {
	if m == nil {
		return string(b)
	}
	if s, ok := m[string(b)]; ok {
		return s
	}
	s := string(b)
	m[s] = s
	return s
}

func decodeChain(fam ruleset.Family, obj []byte) *installed.Chain {
	ch := &installed.Chain{Family: fam}
	nftnl.EachAttr(obj, func(typ uint16, d []byte) {
		switch typ {
		case unix.NFTA_CHAIN_TABLE:
			ch.Table = string(nftnl.CStr(d))
		case unix.NFTA_CHAIN_NAME:
			ch.Name = string(nftnl.CStr(d))
		case nftaChainUserdata:
			ch.Comment = nftnl.UserdataComment(d)
		case unix.NFTA_CHAIN_HOOK:
			nftnl.EachAttr(d, func(t uint16, h []byte) {
				if t == unix.NFTA_HOOK_HOOKNUM && len(h) == 4 {
					ch.Hook = hookNames[binary.BigEndian.Uint32(h)]
				}
			})
		}
	})
	return ch
}

// deleteHandles removes rules read back, by handle, in one transaction.
func deleteHandles(c *nftnl.Conn, rules []installed.Rule) error {
	ids := make([]nftnl.RuleID, len(rules))
	for i, r := range rules {
		ids[i] = nftnl.RuleID{Family: r.Family, Table: r.Table, Chain: r.Chain, Handle: r.Handle}
	}
	return c.DeleteRules(ids)
}

// decodeRule reads a rule's attributes into a Rule, taking the table's and
// chain's names from names (nil: a string each).
//
// It allocates only the strings it returns that names does not hold (a
// comment, mostly): a CHECK or DEL reads every pod's rule of a chain, so
// expressions are decoded into fixed arrays (exprAttrs, regs), not maps.
// `go test -run '^$' -bench ReadChain ./internal/firewall/` measures it.
func decodeRule(fam ruleset.Family, obj []byte, names strs) installed.Rule {
	r := installed.Rule{Family: fam}
	nftnl.EachAttr(obj, func(typ uint16, d []byte) {
		switch typ {
		case unix.NFTA_RULE_TABLE:
			r.Table = names.of(nftnl.CStr(d))
		case unix.NFTA_RULE_CHAIN:
			r.Chain = names.of(nftnl.CStr(d))
		case unix.NFTA_RULE_HANDLE:
			if len(d) == 8 {
				r.Handle = binary.BigEndian.Uint64(d)
			}
		case unix.NFTA_RULE_USERDATA:
			if cm := nftnl.UserdataComment(d); cm != "" {
				r.Comment = cm
			}
		case unix.NFTA_RULE_EXPRESSIONS:
			decodeExprs(d, &r)
		}
	})
	return r
}

// regKind is what loaded a register.
type regKind uint8

const (
	regNone regKind = iota
	regPayload
	regMeta
	regFib
	regCt
	regImm
)

func (k regKind) String() string {
	return [...]string{"none", "payload", "meta", "fib", "ct", "imm"}[k]
}

// reg is what an expression loaded into a register.
type reg struct {
	kind   regKind
	base   uint32 // payload
	offset uint32 // payload
	key    uint32 // meta, ct
	data   []byte // imm
	mask   []byte // a bitwise applied to the load
	xor    []byte
}

// regs are a rule's registers, by number (NFT_REG_VERDICT 0, NFT_REG_1 to
// NFT_REG_4, NFT_REG32_00 (8) to NFT_REG32_15 (23)).
type regs [unix.NFT_REG32_15 + 1]reg

// at is register n (nil for a number no register has).
func (rs *regs) at(n uint32) *reg {
	if n >= uint32(len(rs)) {
		return nil
	}
	return &rs[n]
}

// loaded is register n when an expression loaded it, else nil.
func (rs *regs) loaded(n uint32) *reg {
	if x := rs.at(n); x != nil && x.kind != regNone {
		return x
	}
	return nil
}

// set loads register n (a number no register has is ignored: what reads
// it then finds nothing).
func (rs *regs) set(n uint32, x reg) {
	if p := rs.at(n); p != nil {
		*p = x
	}
}

// decodeExprs reads a rule's expression list into r.
func decodeExprs(list []byte, r *installed.Rule) {
	var rs regs
	nftnl.EachExpr(list, func(name, data []byte) { decodeExpr(name, data, r, &rs) })
}

// u32 reads a big-endian 32-bit attribute.
func u32(d []byte) uint32 {
	if len(d) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(d)
}

// exprAttrs are an expression's attributes by type (nil: absent). Every
// expression the decoder knows numbers its attributes below 16.
type exprAttrs [16][]byte

func attrsOf(data []byte) (a exprAttrs) {
	nftnl.EachAttr(data, func(typ uint16, d []byte) {
		if int(typ) < len(a) {
			a[typ] = d
		}
	})
	return a
}

// dataValue reads a nested NFTA_DATA_VALUE.
func dataValue(d []byte) []byte {
	var v []byte
	nftnl.EachAttr(d, func(typ uint16, x []byte) {
		if typ == unix.NFTA_DATA_VALUE {
			v = x
		}
	})
	return v
}

func decodeExpr(name, data []byte, r *installed.Rule, regs *regs) {
	a := attrsOf(data)
	switch string(name) {
	case "payload":
		if a[unix.NFTA_PAYLOAD_SREG] != nil {
			r.AddUnknown("payload set")
			return
		}
		regs.set(u32(a[unix.NFTA_PAYLOAD_DREG]), reg{kind: regPayload, base: u32(a[unix.NFTA_PAYLOAD_BASE]), offset: u32(a[unix.NFTA_PAYLOAD_OFFSET])})
	case "meta":
		if d := a[unix.NFTA_META_DREG]; d != nil {
			regs.set(u32(d), reg{kind: regMeta, key: u32(a[unix.NFTA_META_KEY])})
			return
		}
		src := regs.loaded(u32(a[unix.NFTA_META_SREG]))
		if u32(a[unix.NFTA_META_KEY]) == unix.NFT_META_MARK && src != nil {
			// The mark is in host byte order, like meta mark's load.
			switch {
			case src.kind == regImm:
				r.SetMark = nativeUint(src.data)
			case src.xor != nil:
				r.SetMark = nativeUint(src.xor)
			}
			if r.Target == "" {
				r.Target = "MARK"
			}
			return
		}
		r.AddUnknown("meta set")
	case "fib":
		regs.set(u32(a[unix.NFTA_FIB_DREG]), reg{kind: regFib, key: u32(a[unix.NFTA_FIB_RESULT]), offset: u32(a[unix.NFTA_FIB_FLAGS])})
	case "ct":
		if d := a[unix.NFTA_CT_DREG]; d != nil {
			regs.set(u32(d), reg{kind: regCt, key: u32(a[unix.NFTA_CT_KEY])})
			return
		}
		if r.Target == "" {
			r.Target = "CONNMARK"
		}
	case "bitwise":
		src := regs.loaded(u32(a[unix.NFTA_BITWISE_SREG]))
		if src == nil {
			return
		}
		x := *src
		x.mask, x.xor = dataValue(a[unix.NFTA_BITWISE_MASK]), dataValue(a[unix.NFTA_BITWISE_XOR])
		regs.set(u32(a[unix.NFTA_BITWISE_DREG]), x)
	case "immediate":
		dreg := u32(a[unix.NFTA_IMMEDIATE_DREG])
		if dreg == unix.NFT_REG_VERDICT {
			nftnl.EachAttr(a[unix.NFTA_IMMEDIATE_DATA], func(typ uint16, d []byte) {
				if typ == unix.NFTA_DATA_VERDICT {
					decodeVerdict(d, r)
				}
			})
			return
		}
		regs.set(dreg, reg{kind: regImm, data: dataValue(a[unix.NFTA_IMMEDIATE_DATA])})
	case "cmp":
		src := regs.loaded(u32(a[unix.NFTA_CMP_SREG]))
		neq := u32(a[unix.NFTA_CMP_OP]) == unix.NFT_CMP_NEQ
		if src == nil || (u32(a[unix.NFTA_CMP_OP]) != unix.NFT_CMP_EQ && !neq) {
			r.AddUnknown("cmp")
			return
		}
		decodeCmp(src, dataValue(a[unix.NFTA_CMP_DATA]), neq, r)
	case "nat":
		if u32(a[unix.NFTA_NAT_TYPE]) == unix.NFT_NAT_DNAT {
			r.Target = "DNAT"
		} else {
			r.Target = "SNAT"
		}
		var addr netip.Addr
		if x := regs.loaded(u32(a[nftaNatRegAddrMin])); x != nil && x.kind == regImm {
			addr, _ = netip.AddrFromSlice(x.data)
		}
		var port uint16
		if x := regs.loaded(u32(a[unix.NFTA_NAT_REG_PROTO_MIN])); x != nil && x.kind == regImm {
			port = uint16(beUint(x.data))
		}
		r.ToDest = netip.AddrPortFrom(addr, port)
	case "masq":
		r.Target = "MASQUERADE"
	case "redir":
		r.Target = "REDIRECT"
		if x := regs.loaded(u32(a[unix.NFTA_REDIR_REG_PROTO_MIN])); x != nil && x.kind == regImm {
			r.ToPort = uint16(beUint(x.data))
		}
	case "tproxy":
		r.Target = "TPROXY"
		if x := regs.loaded(u32(a[nftaTproxyRegPort])); x != nil && x.kind == regImm {
			r.ToPort = uint16(beUint(x.data))
		}
	case "match":
		decodeXTMatch(nftnl.CStr(a[unix.NFTA_MATCH_NAME]), u32(a[unix.NFTA_MATCH_REV]), a[unix.NFTA_MATCH_INFO], r)
	case "target":
		decodeXTTarget(nftnl.CStr(a[unix.NFTA_TARGET_NAME]), u32(a[unix.NFTA_TARGET_REV]), a[unix.NFTA_TARGET_INFO], r)
	case "counter":
	default:
		r.AddUnknown(string(name))
	}
}

// targetName is an xtables target's name, without an allocation for the
// targets meshwire's rules use.
func targetName(b []byte) string {
	for _, t := range [...]string{"MASQUERADE", "DNAT", "SNAT", "REDIRECT", "TPROXY", "MARK", "CONNMARK", "ACCEPT", "DROP", "RETURN"} {
		if t == string(b) {
			return t
		}
	}
	return string(b)
}

// beUint reads up to 4 bytes big-endian.
func beUint(b []byte) uint32 {
	var v uint32
	for _, x := range b[:min(len(b), 4)] {
		v = v<<8 | uint32(x)
	}
	return v
}

func decodeVerdict(d []byte, r *installed.Rule) {
	var code int32
	var chain string
	nftnl.EachAttr(d, func(typ uint16, x []byte) {
		switch typ {
		case unix.NFTA_VERDICT_CODE:
			code = int32(u32(x))
		case unix.NFTA_VERDICT_CHAIN:
			chain = string(nftnl.CStr(x))
		}
	})
	verdict := ""
	switch code {
	case unix.NFT_JUMP, unix.NFT_GOTO:
		r.Jump, r.Goto = chain, code == unix.NFT_GOTO
		return
	case nfAccept:
		verdict = "ACCEPT"
	case nfDrop:
		verdict = "DROP"
	case unix.NFT_RETURN:
		verdict = "RETURN"
	default:
		return
	}
	if r.Target == "" || r.Target == "MARK" {
		r.Target = verdict
	}
}

// addrFamily is the address family of a rule's network-header loads.
func addrFamily(r *installed.Rule) ruleset.IPVersion {
	switch {
	case r.IPFamily != 0:
		return r.IPFamily
	case r.Family == ruleset.IP6:
		return ruleset.V6
	}
	return ruleset.V4
}

func decodeCmp(src *reg, v []byte, neq bool, r *installed.Rule) {
	switch src.kind {
	case regPayload:
		switch src.base {
		case unix.NFT_PAYLOAD_NETWORK_HEADER:
			f := addrFamily(r)
			size, srcOff, dstOff := 4, uint32(12), uint32(16)
			if f == ruleset.V6 || (r.IPFamily == 0 && (src.offset == 8 || src.offset == 24)) {
				f, size, srcOff, dstOff = ruleset.V6, 16, 8, 24
			}
			if src.offset != srcOff && src.offset != dstOff {
				r.AddUnknown("payload network")
				return
			}
			full := make([]byte, size)
			copy(full, v)
			bits := len(v) * 8
			if src.mask != nil {
				bits = 0
				for _, m := range src.mask {
					for m&0x80 != 0 {
						bits++
						m <<= 1
					}
				}
			}
			addr, _ := netip.AddrFromSlice(full)
			p := netip.PrefixFrom(addr, bits).Masked()
			if src.offset == srcOff {
				r.Src, r.NotSrc = p, neq
			} else {
				r.Dst, r.NotDst = p, neq
			}
			if r.IPFamily == 0 && (r.Family == ruleset.Inet || r.Family == ruleset.Bridge) {
				r.IPFamily = f
			}
		case unix.NFT_PAYLOAD_TRANSPORT_HEADER:
			switch src.offset {
			case 0:
				r.SPort = uint16(beUint(v))
			case 2:
				r.DPort, r.NotDPort = uint16(beUint(v)), neq
			default:
				r.AddUnknown("payload transport")
			}
		default:
			r.AddUnknown("payload")
		}
	case regMeta:
		switch src.key {
		case unix.NFT_META_L4PROTO:
			if len(v) > 0 {
				r.Proto = protoName(v[0])
			}
		case unix.NFT_META_NFPROTO:
			if len(v) > 0 {
				switch v[0] {
				case unix.NFPROTO_IPV4:
					r.IPFamily = ruleset.V4
				case unix.NFPROTO_IPV6:
					r.IPFamily = ruleset.V6
				}
			}
		case unix.NFT_META_IIFNAME:
			r.In = string(nftnl.CStr(v))
		case unix.NFT_META_OIFNAME:
			r.Out = string(nftnl.CStr(v))
		case unix.NFT_META_MARK:
			r.HasMark, r.Mark, r.NotMark, r.MarkMask = true, nativeUint(v), neq, 0xffffffff
			if src.mask != nil {
				r.MarkMask = nativeUint(src.mask)
			}
		default:
			r.AddUnknown("meta " + strconv.Itoa(int(src.key)))
		}
	case regFib:
		if src.key == unix.NFT_FIB_RESULT_ADDRTYPE && src.offset&unix.NFTA_FIB_F_DADDR != 0 && nativeUint(v) == unix.RTN_LOCAL && !neq {
			r.DstLocal = true
			return
		}
		r.AddUnknown("fib")
	default:
		r.AddUnknown(src.kind.String())
	}
}

// nativeUint reads a 32-bit value in host byte order (meta mark, fib
// results are in the host's order).
func nativeUint(b []byte) uint32 {
	if len(b) < 4 {
		return 0
	}
	return binary.NativeEndian.Uint32(b)
}

func protoName(p byte) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_ICMPV6:
		return "ipv6-icmp"
	}
	return strconv.Itoa(int(p))
}

// decodeXTMatch reads the xtables matches iptables-nft uses for meshwire's
// rules (the info blobs are the kernel's structs, in host byte order).
func decodeXTMatch(nameB []byte, rev uint32, info []byte, r *installed.Rule) {
	ne := binary.NativeEndian
	switch string(nameB) {
	case "comment":
		r.Comment = string(nftnl.CStr(info))
	case "tcp", "udp":
		// struct xt_udp: spts[2], dpts[2], invflags; struct xt_tcp:
		// spts[2], dpts[2], option, flg_mask, flg_cmp, invflags.
		name, invAt := "udp", 8
		if string(nameB) == "tcp" {
			name, invAt = "tcp", 11
		}
		if len(info) <= invAt {
			r.AddUnknown(name)
			return
		}
		inv := info[invAt]
		if name == "tcp" && (info[8] != 0 || info[9] != 0) {
			r.AddUnknown("tcp flags") // --tcp-option, --tcp-flags
		}
		// A range of one port is typed; 0:65535 is no match; other
		// ranges and a negated source port are not held by the fields.
		switch sl, sh := ne.Uint16(info[0:]), ne.Uint16(info[2:]); {
		case sl == 0 && sh == 0xffff && inv&0x01 == 0:
		case sl == sh && sl != 0 && inv&0x01 == 0:
			r.SPort = sl
		default:
			r.AddUnknown(name + " sport")
		}
		switch lo, hi := ne.Uint16(info[4:]), ne.Uint16(info[6:]); {
		case lo == 0 && hi == 0xffff && inv&0x02 == 0:
		case lo == hi && lo != 0:
			r.DPort, r.NotDPort = lo, inv&0x02 != 0
		default:
			r.AddUnknown(name + " dport")
		}
		if r.Proto == "" {
			r.Proto = name
		}
	case "addrtype":
		var dest uint16
		var invDest bool
		switch {
		case rev == 1 && len(info) >= 8:
			dest, invDest = ne.Uint16(info[2:]), ne.Uint32(info[4:])&0x2 != 0
		case rev == 0 && len(info) >= 12:
			dest, invDest = ne.Uint16(info[2:]), ne.Uint32(info[8:]) != 0
		}
		switch {
		case dest == 1<<unix.RTN_LOCAL && !invDest:
			r.DstLocal = true
		case dest == 1<<unix.RTN_MULTICAST && invDest:
			r.NotDstMulticast = true
		default:
			r.AddUnknown("addrtype")
		}
	case "mark":
		if len(info) >= 9 {
			r.HasMark, r.Mark, r.MarkMask, r.NotMark = true, ne.Uint32(info), ne.Uint32(info[4:]), info[8] != 0
		}
	default:
		r.AddUnknown(string(nameB))
	}
}

// decodeXTTarget reads an xtables target's name and the options the typed
// fields hold.
func decodeXTTarget(nameB []byte, rev uint32, info []byte, r *installed.Rule) {
	r.Target = targetName(nameB)
	ne := binary.NativeEndian
	be := binary.BigEndian
	switch r.Target {
	case "DNAT":
		// rev 0: nf_nat_ipv4_multi_range_compat (rangesize, then flags,
		// min_ip, max_ip, min port, max port); rev 1, 2: nf_nat_range(2)
		// (flags, min_addr[16], max_addr[16], min_proto, ...).
		if rev == 0 && len(info) >= 20 {
			ip, _ := netip.AddrFromSlice(info[8:12])
			r.ToDest = netip.AddrPortFrom(ip, be.Uint16(info[16:]))
		} else if len(info) >= 38 {
			raw := info[4:20]
			var ip netip.Addr
			if r.Family == ruleset.IP || r.IPFamily == ruleset.V4 {
				ip, _ = netip.AddrFromSlice(raw[:4])
			} else {
				ip, _ = netip.AddrFromSlice(raw)
			}
			r.ToDest = netip.AddrPortFrom(ip, be.Uint16(info[36:]))
		}
	case "REDIRECT":
		switch {
		case r.Family == ruleset.IP6 && len(info) >= 38:
			r.ToPort = be.Uint16(info[36:])
		case len(info) >= 18:
			r.ToPort = be.Uint16(info[16:])
		}
	case "TPROXY":
		switch {
		case rev >= 1 && len(info) >= 26:
			r.SetMark, r.ToPort = ne.Uint32(info[4:]), be.Uint16(info[24:])
		case len(info) >= 14:
			r.SetMark, r.ToPort = ne.Uint32(info[4:]), be.Uint16(info[12:])
		}
	case "MARK":
		if len(info) >= 4 {
			r.SetMark = ne.Uint32(info)
		}
	}
}
