package main

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// What portmap reads back: its own objects only, as typed rules from the
// firewall front door (firewall.Interface), never as the tools' text. For
// iptables that is the nat table of one family, for nftables the table
// inet meshwire_portmap; the fast paths read one chain of it. A nil
// *installed.Table or *installed.Chain is one that is not there.

// rulesOf returns the rules of chain in t.
func rulesOf(t *installed.Table, chain string) []installed.Rule {
	if c := t.Chain(chain); c != nil {
		return c.Rules
	}
	return nil
}

// jumpsIn returns the rules that jump to target.
func jumpsIn(rules []installed.Rule, target string) []installed.Rule {
	var out []installed.Rule
	for _, r := range rules {
		if r.Jump == target {
			out = append(out, r)
		}
	}
	return out
}

// jumps returns the rules of chain in t that jump to target.
func jumps(t *installed.Table, chain, target string) []installed.Rule {
	return jumpsIn(rulesOf(t, chain), target)
}

// isKey: an attachment key, as chain names carry it (both forms of
// attachment.ID.PortmapKeys are that many lower-case hex digits).
func isKey(s string) bool {
	if len(s) != attachment.PortmapKeyLen {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// attachmentKeys lists the keys of t's attachment chains (prefix + key),
// sorted.
func attachmentKeys(t *installed.Table, prefix string) []string {
	var keys []string
	if t != nil {
		for _, c := range t.Chains {
			if k, ok := strings.CutPrefix(c.Name, prefix); ok && isKey(k) {
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	return keys
}

// tableOf is a table holding just the chains given (those read one by one
// on a fast path), in the order given.
func tableOf(name string, chains ...*installed.Chain) *installed.Table {
	return &installed.Table{Name: name, Chains: chains}
}

// presentKeys are the keys whose attachment chain is in t.
func presentKeys(t *installed.Table, prefix string, keys []string) []string {
	var out []string
	for _, k := range keys {
		if t.Chain(prefix+k) != nil {
			out = append(out, k)
		}
	}
	return out
}

// mappingSig is a comparable description of one DNAT rule: what CHECK
// compares between the plan and the table.
func mappingSig(proto string, port int, hostIP string, to string) string {
	if hostIP == "" {
		hostIP = "*"
	}
	return fmt.Sprintf("%s/%d@%s->%s", proto, port, hostIP, to)
}

func planSigs(p famPlan) []string {
	var out []string
	for _, r := range p.Rules {
		if r.Action != actDNAT {
			continue
		}
		h := ""
		if r.HostIP != nil {
			h = r.HostIP.String()
		}
		out = append(out, mappingSig(r.Proto, r.HostPort, h, netip.AddrPortFrom(addrOf(r.To), uint16(r.ToPort)).String()))
	}
	sort.Strings(out)
	return out
}

// isDNAT: a rule that maps a host port (what planSigs describes).
func isDNAT(r installed.Rule) bool {
	return r.Target == "DNAT" && r.ToDest.IsValid() && r.Proto != "" && r.DPort != 0
}

// mappingSigs reads the DNAT rules of an attachment chain back (for
// nftables, of both families).
func mappingSigs(rules []installed.Rule) []string {
	var out []string
	for _, r := range rules {
		if !isDNAT(r) {
			continue
		}
		h := ""
		switch {
		case r.Dst.IsValid() && r.Dst.IsSingleIP():
			h = r.Dst.Addr().String()
		case r.Dst.IsValid():
			h = r.Dst.String()
		}
		out = append(out, mappingSig(r.Proto, int(r.DPort), h, r.ToDest.String()))
	}
	sort.Strings(out)
	return out
}

// udpPortsOf lists the UDP host ports of an attachment chain's DNAT rules,
// per family (that of the address they map to).
func udpPortsOf(rules []installed.Rule) map[ruleset.IPVersion][]int {
	out := map[ruleset.IPVersion][]int{}
	for _, r := range rules {
		if !isDNAT(r) || r.Proto != "udp" {
			continue
		}
		f := ruleset.V4
		if !r.ToDest.Addr().Unmap().Is4() {
			f = ruleset.V6
		}
		out[f] = append(out[f], int(r.DPort))
	}
	return out
}

// mergePorts adds the ports of more to into.
func mergePorts(into, more map[ruleset.IPVersion][]int) {
	for f, ports := range more {
		into[f] = append(into[f], ports...)
	}
}

// sortedChains lists the chains of t whose name starts with prefix,
// sorted.
func sortedChains(t *installed.Table, prefix string) []string {
	var out []string
	if t != nil {
		for _, c := range t.Chains {
			if strings.HasPrefix(c.Name, prefix) {
				out = append(out, c.Name)
			}
		}
	}
	slices.SortFunc(out, cmp.Compare[string])
	return out
}

// remaining counts attachments that stay after removing keys.
func remaining(all, removed []string) int {
	n := 0
	for _, k := range all {
		if !slices.Contains(removed, k) {
			n++
		}
	}
	return n
}
