package fwfake

import (
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// readBack is the rule a read of the kernel gives back for r written to a
// table of family fam: the typed fields the real decoders fill, the
// matches they do not hold named in Unknown, and as Spec the rule's
// iptables form (iptables tables) or its nft statement (native tables),
// as written (Dump shows it; reads of nf_tables clear it).
func readBack(fam ruleset.Family, r ruleset.Rule, iptables bool) installed.Rule {
	out := installed.Rule{Family: fam, Chain: r.Chain, Comment: r.Comment}
	if iptables {
		out.Spec = fwtext.IPTablesSpec(r)
	} else {
		out.Spec = fwtext.NftStatement(r)
	}
	mixed := fam == ruleset.Inet || fam == ruleset.Bridge
	for _, m := range r.Match {
		switch m.Kind {
		case ruleset.MatchIn, ruleset.MatchOut:
			if m.Not {
				out.AddUnknown("!" + map[ruleset.MatchKind]string{ruleset.MatchIn: "-i", ruleset.MatchOut: "-o"}[m.Kind])
			} else if m.Kind == ruleset.MatchIn {
				out.In = m.Name
			} else {
				out.Out = m.Name
			}
		case ruleset.MatchProto:
			if m.Not {
				out.AddUnknown("!-p")
			} else {
				out.Proto = m.Name
			}
		case ruleset.MatchSrc, ruleset.MatchDst:
			if m.Kind == ruleset.MatchSrc {
				out.Src, out.NotSrc = m.Prefix.Masked(), m.Not
			} else {
				out.Dst, out.NotDst = m.Prefix.Masked(), m.Not
			}
			if mixed {
				out.IPFamily = ruleset.V4
				if m.Prefix.Addr().Is6() {
					out.IPFamily = ruleset.V6
				}
			}
		case ruleset.MatchSPort, ruleset.MatchDPort:
			out.Proto = m.Name
			switch {
			case len(m.Ports) != 1 || m.Kind == ruleset.MatchSPort && m.Not:
				out.AddUnknown(m.Name + " ports")
			case m.Kind == ruleset.MatchSPort:
				out.SPort = m.Ports[0]
			default:
				out.DPort, out.NotDPort = m.Ports[0], m.Not
			}
		case ruleset.MatchMark:
			out.HasMark, out.Mark, out.MarkMask, out.NotMark = true, m.Value, m.Mask, m.Not
			if m.Mask == 0 {
				out.MarkMask = 0xffffffff
			}
		case ruleset.MatchDstType:
			switch {
			case m.Name == "LOCAL" && !m.Not:
				out.DstLocal = true
			case m.Name == "MULTICAST" && m.Not:
				out.NotDstMulticast = true
			default:
				out.AddUnknown("addrtype")
			}
		case ruleset.MatchNfproto:
			out.IPFamily = map[string]ruleset.IPVersion{"ipv4": ruleset.V4, "ipv6": ruleset.V6}[m.Name]
		default:
			out.AddUnknown(matchNames[m.Kind])
		}
	}
	t := r.Target
	switch t.Kind {
	case ruleset.Jump:
		out.Jump = t.Chain
	case ruleset.Redirect:
		out.Target, out.ToPort = "REDIRECT", t.Port
	case ruleset.TProxy:
		out.Target, out.ToPort, out.SetMark = "TPROXY", t.Port, t.Mark
	case ruleset.SetMark:
		out.Target, out.SetMark = "MARK", t.Mark
	case ruleset.DNAT:
		out.Target, out.ToDest = "DNAT", t.To
	case ruleset.None:
	default:
		out.Target = targetNames[t.Kind]
	}
	return out
}

var matchNames = map[ruleset.MatchKind]string{
	ruleset.MatchConnMark: "connmark", ruleset.MatchCTState: "conntrack", ruleset.MatchCTDir: "conntrack",
	ruleset.MatchUID: "owner", ruleset.MatchGID: "owner", ruleset.MatchEtherSrc: "ether", ruleset.MatchRaw: "raw",
	ruleset.MatchProtoModule: "proto module", ruleset.MatchSocketExists: "owner", ruleset.MatchDstSet: "set",
}

var targetNames = map[ruleset.TargetKind]string{
	ruleset.Return: "RETURN", ruleset.Accept: "ACCEPT", ruleset.Drop: "DROP", ruleset.ConnmarkSave: "CONNMARK",
	ruleset.ConnmarkRestore: "CONNMARK", ruleset.CTZone: "CT", ruleset.Masquerade: "MASQUERADE",
	ruleset.SNAT: "SNAT", ruleset.ConnmarkSet: "CONNMARK",
}
