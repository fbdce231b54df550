package fwnetlink

import (
	"encoding/binary"
	"errors"
	"fmt"

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
