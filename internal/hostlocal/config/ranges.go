package config

import (
	"bytes"
	"fmt"
	"net"
	"strings"

	"github.com/meshwire/meshwire/internal/addressing"
	"github.com/meshwire/meshwire/internal/cnierr"
)

// Range is one canonical range: every address is in its family's short form
// (4 bytes for IPv4, 16 for IPv6), RangeStart..RangeEnd inclusive.
type Range struct {
	Subnet     net.IPNet
	RangeStart net.IP
	RangeEnd   net.IP
	Gateway    net.IP
}

// RangeSet is a list of ranges of one family; ADD takes one address from
// each set.
type RangeSet []Range

// parseRange applies the reference's defaults and checks: the subnet is a
// network address with at least two host bits, the gateway defaults to the
// first host, rangeStart to the first host and rangeEnd to the last usable
// address (IPv4 excludes the broadcast address).
func parseRange(field string, r rawRange) (Range, error) {
	var out Range
	if r.Subnet == "" {
		return out, cnierr.Field(field+".subnet", "missing")
	}
	addr, subnet, err := net.ParseCIDR(r.Subnet)
	if err != nil {
		return out, cnierr.Field(field+".subnet", "%q is not a CIDR such as 10.1.0.0/16", r.Subnet)
	}
	addr = canonical(addr)
	ones, bits := subnet.Mask.Size()
	if ones > bits-2 {
		return out, cnierr.Field(field+".subnet", "network %s is too small to allocate from (a /%d has no host addresses besides the gateway; use at most /%d)", r.Subnet, ones, bits-2)
	}
	network := addr.Mask(subnet.Mask)
	if !addr.Equal(network) {
		return out, cnierr.Field(field+".subnet", "%s has host bits set: for a /%d the network address is %s", r.Subnet, ones, network)
	}
	out.Subnet = net.IPNet{IP: network, Mask: subnet.Mask}
	// bound parses an optional address of the range; inSubnet requires it
	// inside the subnet; def is the default when it is not given.
	bound := func(name, value string, inSubnet bool, def net.IP) (net.IP, error) {
		if value == "" {
			return def, nil
		}
		a := net.ParseIP(value)
		if a == nil {
			return nil, cnierr.Field(field+"."+name, "%q is not an IP address", value)
		}
		a = canonical(a)
		if len(a) != len(network) {
			return nil, cnierr.Field(field+"."+name, "%s is not of the address family of subnet %s", value, r.Subnet)
		}
		if inSubnet && !subnet.Contains(a) {
			return nil, cnierr.Field(field+"."+name, "%s is not in subnet %s", value, r.Subnet)
		}
		return a, nil
	}
	if out.Gateway, err = bound("gateway", r.Gateway, false, addressing.NextIP(network)); err != nil {
		return out, err
	}
	if out.RangeStart, err = bound("rangeStart", r.RangeStart, true, addressing.NextIP(network)); err != nil {
		return out, err
	}
	if out.RangeEnd, err = bound("rangeEnd", r.RangeEnd, true, lastIP(out.Subnet)); err != nil {
		return out, err
	}
	if cmp(out.RangeStart, out.RangeEnd) > 0 {
		return out, cnierr.Field(field+".rangeEnd", "%s is before rangeStart %s", out.RangeEnd, out.RangeStart)
	}
	return out, nil
}

func parseRangeSet(field string, raw []rawRange) (RangeSet, error) {
	single := field == "ipam" // the legacy form: fields at the top level of ipam
	if len(raw) == 0 {
		return nil, cnierr.Field(field, "empty range set")
	}
	var rs RangeSet
	for i, rr := range raw {
		f := fmt.Sprintf("%s[%d]", field, i)
		if single {
			f = field
		}
		r, err := parseRange(f, rr)
		if err != nil {
			return nil, err
		}
		if i > 0 && len(r.RangeStart) != len(rs[0].RangeStart) {
			return nil, cnierr.Field(f+".subnet", "mixed address families in one range set (%s and %s)", rs[0].Subnet.String(), r.Subnet.String())
		}
		for j := range rs {
			if rs[j].Overlaps(r) {
				return nil, cnierr.Field(f, "range %s overlaps with %s[%d] (%s)", r, field, j, rs[j])
			}
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// lastIP is the last address of the subnet, less the broadcast address for
// IPv4.
func lastIP(n net.IPNet) net.IP {
	end := make(net.IP, len(n.IP))
	for i := range n.IP {
		end[i] = n.IP[i] | ^n.Mask[i]
	}
	if len(end) == net.IPv4len {
		end[3]--
	}
	return end
}

func cmp(a, b net.IP) int { return bytes.Compare(canonical(a), canonical(b)) }

// Contains reports whether a is inside the range (subnet and start..end).
func (r Range) Contains(a net.IP) bool {
	a = canonical(a)
	if len(a) != len(r.RangeStart) || !r.Subnet.Contains(a) {
		return false
	}
	return cmp(a, r.RangeStart) >= 0 && cmp(a, r.RangeEnd) <= 0
}

// Overlaps reports whether two ranges share an address.
func (r Range) Overlaps(o Range) bool {
	if len(r.RangeStart) != len(o.RangeStart) {
		return false
	}
	return cmp(r.RangeStart, o.RangeEnd) <= 0 && cmp(o.RangeStart, r.RangeEnd) <= 0
}

func (r Range) String() string { return r.RangeStart.String() + "-" + r.RangeEnd.String() }

// IsIPv4 reports the set's family.
func (s RangeSet) IsIPv4() bool { return len(s) > 0 && len(s[0].RangeStart) == net.IPv4len }

// RangeFor returns the range holding a, or nil.
func (s RangeSet) RangeFor(a net.IP) *Range {
	for i := range s {
		if s[i].Contains(a) {
			return &s[i]
		}
	}
	return nil
}

// Contains reports whether any range of the set holds a.
func (s RangeSet) Contains(a net.IP) bool { return s.RangeFor(a) != nil }

// Overlaps reports whether two sets share an address.
func (s RangeSet) Overlaps(o RangeSet) bool {
	for _, r := range s {
		for _, r2 := range o {
			if r.Overlaps(r2) {
				return true
			}
		}
	}
	return false
}

func (s RangeSet) String() string {
	parts := make([]string, len(s))
	for i, r := range s {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}

// NextFree is the round-robin choice of the reference: the first address
// after last (or the first address of the set when last is not in it),
// walking the set's ranges in order and wrapping around, skipping each
// range's gateway and every address taken reports as allocated. It returns
// nil when the set is full.
func (s RangeSet) NextFree(last net.IP, taken func(net.IP) bool) (net.IP, *Range) {
	if len(s) == 0 {
		return nil, nil
	}
	ri := 0
	var cur net.IP
	if last != nil {
		last = canonical(last)
		for i := range s {
			if s[i].Contains(last) {
				ri, cur = i, last
				break
			}
		}
	}
	advance := func() {
		if cur == nil {
			cur = s[ri].RangeStart
			return
		}
		if cur.Equal(s[ri].RangeEnd) {
			ri = (ri + 1) % len(s)
			cur = s[ri].RangeStart
			return
		}
		cur = addressing.NextIP(cur)
	}
	advance()
	start := cur
	for {
		r := &s[ri]
		if !cur.Equal(r.Gateway) && !taken(cur) {
			return cur, r
		}
		advance()
		if cur.Equal(start) {
			return nil, nil
		}
	}
}
