package fwnetlink

import (
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/nftnl"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// The xtables matches and targets of iptables-nft's rules, whose info
// blobs are the kernel's structs.

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
