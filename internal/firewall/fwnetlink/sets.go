package fwnetlink

import (
	"errors"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/nftnl"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// ReadSet reads set name of a native nftables table with one element
// dump; nil when the table or the set is not there.
func ReadSet(c *nftnl.Conn, id ruleset.TableID, name string) (*installed.Set, error) {
	keys, err := c.SetElements(id.Family, id.Name, name)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s := &installed.Set{Table: id, Name: name}
	for _, k := range keys {
		if a, ok := netip.AddrFromSlice(k); ok {
			s.Elements = append(s.Elements, ruleset.Element{Addr: a.Unmap()})
		}
	}
	return s, nil
}
