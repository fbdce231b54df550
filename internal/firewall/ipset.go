package firewall

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// The iptables backends' sets are ipsets, which the Host writes and reads
// over netlink (vishvananda/netlink) in the calling thread's namespace,
// one operation at a time, with the meaning of `ipset restore` with
// -exist (fwtext.IPSetRestore is their text): adding what is there and
// removing what is not are no errors, nor is destroying a set that is not
// there. The kernel's answers are told apart by their error numbers.

// applyIPSets applies tx's ipset operations, in order.
func applyIPSets(tx *ruleset.Tx) error {
	for _, o := range tx.Ops() {
		if err := applyIPSet(o); err != nil {
			return fmt.Errorf("%s: %w", o, err)
		}
	}
	return nil
}

func applyIPSet(o ruleset.Op) error {
	name := o.Set.Name
	switch o.Object() + " " + o.Verb.String() {
	case "set add":
		family := uint8(unix.AF_INET)
		if o.Set.Family == ruleset.V6 {
			family = unix.AF_INET6
		}
		// Replace: no error when it is there (its elements stay).
		return netlink.IpsetCreate(name, "hash:ip", netlink.IpsetCreateOptions{Replace: true, Comments: true, Family: family})
	case "set flush":
		return ignoreNoSet(netlink.IpsetFlush(name))
	case "set destroy":
		return ignoreNoSet(netlink.IpsetDestroy(name))
	case "element add":
		for _, e := range o.Elements {
			if err := netlink.IpsetAdd(name, &netlink.IPSetEntry{IP: net.IP(e.Addr.AsSlice()), Comment: e.Comment, Replace: true}); err != nil {
				return err
			}
		}
		return nil
	case "element destroy":
		// Replace (no NLM_F_EXCL): an element that is not there is no
		// error, as with -exist.
		for _, e := range o.Elements {
			if err := ignoreNoSet(netlink.IpsetDel(name, &netlink.IPSetEntry{IP: net.IP(e.Addr.AsSlice()), Replace: true})); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("not an ipset operation")
}

// ignoreNoSet: the set is not there (ENOENT), which a removal does not
// mind.
func ignoreNoSet(err error) error {
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// readIPSet reads ipset name; nil when it is not there.
func readIPSet(f ruleset.IPVersion, name string) (*installed.Set, error) {
	r, err := netlink.IpsetList(name)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s := &installed.Set{Table: ruleset.IPSets(f), Name: name}
	for _, e := range r.Entries {
		if a, ok := netip.AddrFromSlice(e.IP); ok {
			s.Elements = append(s.Elements, ruleset.Element{Addr: a.Unmap(), Comment: e.Comment})
		}
	}
	return s, nil
}
