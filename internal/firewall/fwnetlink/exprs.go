package fwnetlink

import (
	"encoding/binary"
	"net/netip"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/nftnl"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// The expressions of a rule, decoded into its typed fields: a register
// machine that follows the loads (payload, meta, fib, ct) into the
// comparisons, lookups and statements that use them.

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
