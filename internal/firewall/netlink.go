package firewall

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Reading and removing rules over netlink, in the calling thread's network
// namespace. A firewall tool costs a process start and, for iptables-nft, a
// read of the whole table plus a generation-checked commit that is retried
// from scratch whenever another writer committed first: with 20 pods torn
// down at once, most of a DEL went there. Removal by handle needs none of
// that, so the DEL, CHECK and GC paths of nf_tables-backed rules use this;
// rules are still written with the tools, whose encoding of iptables
// matches is theirs to choose.

// NFTablesBacked reports whether b's iptables rules live in nf_tables (the
// iptables-nft variant, or a default `iptables` that is iptables-nft), so
// that they can be read and removed with ChainRules and DeleteRules.
func (b Backend) NFTablesBacked() bool {
	switch {
	case b.Kind != IPTables:
		return false
	case b.Variant == VariantNFT:
		return true
	case b.Variant == VariantLegacy:
		return false
	}
	return defaultIsNFT()
}

var defaultIsNFT = sync.OnceValue(func() bool { return isNFTTool(resolveTool("iptables-restore")) })

// resolveTool follows a tool's symlinks (Debian's alternatives) to the
// binary that implements it; "" when it is not installed.
func resolveTool(name string) string {
	p, err := exec.LookPath(name)
	if err != nil {
		return ""
	}
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	return filepath.Base(p)
}

// isNFTTool tells an iptables-nft binary (xtables-nft-multi,
// iptables-nft-restore) from a legacy one (xtables-legacy-multi, the
// single-binary iptables-restore of iptables < 1.8).
func isNFTTool(base string) bool { return strings.Contains(base, "nft") }

// Rule is one rule of an nf_tables chain as meshwire reads it back.
type Rule struct {
	Handle uint64
	// Comment is the text of the rule's `-m comment` match (iptables-nft),
	// or of its nftables comment.
	Comment string
	// Target is the xtables target's name ("MASQUERADE", "DNAT"), with
	// native verdict statements named as iptables names them
	// ("MASQUERADE" for masq); "" when the rule has none of these.
	Target string
}

func famName(f Family) string {
	if f == V6 {
		return "ip6"
	}
	return "ip"
}

func tableFamily(f Family) nftables.TableFamily {
	if f == V6 {
		return nftables.TableFamilyIPv6
	}
	return nftables.TableFamilyIPv4
}

// isNotFound reports a missing table or chain. The library flattens the
// kernel's errno into its message, so the text is all there is to go by.
func isNotFound(err error) bool {
	return errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), unix.ENOENT.Error())
}

// Conn is a netlink connection to nf_tables in the calling thread's network
// namespace, for a series of reads and transactions.
//
// Closing the last descriptor of a netfilter netlink socket waits until the
// kernel has freed everything any transaction removed, node-wide (an RCU
// grace period: 10 to 30 ms here, more under load). Release lets a caller
// that removed rules hand that wait to a process that outlives it.
type Conn struct {
	c       *nftables.Conn
	nl      *netlink.Conn
	removed bool
}

// Open opens a connection.
func Open() (*Conn, error) {
	conn := &Conn{}
	c, err := nftables.New(nftables.AsLasting(), nftables.WithSockOptions(func(nl *netlink.Conn) error {
		conn.nl = nl
		return nil
	}))
	if err != nil {
		return nil, fmt.Errorf("nf_tables: %w", err)
	}
	conn.c = c
	return conn, nil
}

// Close closes the connection (waiting, when a removal was committed, as
// described at Conn).
func (c *Conn) Close() error { return c.c.CloseLasting() }

// Release closes the connection. When a transaction removed something, it
// first duplicates the socket and returns the duplicate, which the caller
// passes to a process that outlives it (detach.Start) and then closes, so
// that its own close is not the last; otherwise it returns nil.
func (c *Conn) Release() *os.File {
	var dup *os.File
	if c.removed && c.nl != nil {
		if raw, err := c.nl.SyscallConn(); err == nil {
			_ = raw.Control(func(fd uintptr) {
				if nfd, err := unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0); err == nil {
					dup = os.NewFile(uintptr(nfd), "nf_tables")
				}
			})
		}
	}
	_ = c.Close()
	return dup
}

// dumpPatience bounds the time spent reading again a dump that writers
// keep changing (iptables-nft retries without a bound).
const dumpPatience = 2 * time.Second

// dump runs an nf_tables dump request of type msgType for family fam and
// returns the attributes of each object. A dump spans several reads, and a
// commit in between shifts the kernel's position in the list it walks, so
// that objects are skipped (and the kernel's mark of such a dump can land on
// the final message alone, which the netlink library drops): the dump counts
// only when the ruleset's generation is the same before and after it.
func (c *Conn) dump(msgType int, fam nftables.TableFamily, attrs []netlink.Attribute) ([][]byte, error) {
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return nil, err
	}
	req := netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msgType),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: append(nfgenHeader(fam), data...),
	}
	start := time.Now()
	for attempt := 1; ; attempt++ {
		before, err := c.generation()
		if err != nil {
			return nil, err
		}
		msgs, err := c.nl.Execute(req)
		if err != nil {
			return nil, err
		}
		after, err := c.generation()
		if err != nil {
			return nil, err
		}
		if before == after {
			out := make([][]byte, 0, len(msgs))
			for _, m := range msgs {
				if len(m.Data) >= 4 {
					out = append(out, m.Data[4:])
				}
			}
			return out, nil
		}
		if time.Since(start) > dumpPatience {
			return nil, fmt.Errorf("the ruleset changed during each of %d reads in %v", attempt, dumpPatience)
		}
		// Back off, with jitter, so that readers do not keep meeting the
		// same writers.
		time.Sleep(min(time.Duration(attempt), 20) * time.Duration(50+rand.IntN(100)) * time.Microsecond)
	}
}

// nfgenHeader is the nfgenmsg that starts every nf_tables message.
func nfgenHeader(fam nftables.TableFamily) []byte {
	return []byte{byte(fam), unix.NFNETLINK_V0, 0, 0}
}

// generation returns the ruleset's generation, which every commit advances.
func (c *Conn) generation() (uint32, error) {
	msgs, err := c.nl.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN),
			Flags: netlink.Request,
		},
		Data: nfgenHeader(nftables.TableFamilyUnspecified),
	})
	if err != nil {
		return 0, fmt.Errorf("read the ruleset generation: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, err
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), nil
			}
		}
	}
	return 0, fmt.Errorf("read the ruleset generation: no generation in the answer")
}

// ChainRules returns the rules of chain in the iptables-nft table of family
// f (table "nat" is `ip nat` for V4, `ip6 nat` for V6). A table or chain that
// is not there has no rules.
func (c *Conn) ChainRules(f Family, table, chain string) ([]Rule, error) {
	objs, err := c.dump(unix.NFT_MSG_GETRULE, tableFamily(f), []netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: []byte(table + "\x00")},
		{Type: unix.NFTA_RULE_CHAIN, Data: []byte(chain + "\x00")},
	})
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("nf_tables: read %s %s %s: %w", famName(f), table, chain, err)
	}
	rules := make([]Rule, 0, len(objs))
	for _, o := range objs {
		r, err := parseRule(o)
		if err != nil {
			return nil, fmt.Errorf("nf_tables: read %s %s %s: %w", famName(f), table, chain, err)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// parseRule reads what Rule holds from a rule's attributes, skipping the
// rest (only the comment match's info and the target's name are looked at).
func parseRule(b []byte) (Rule, error) {
	var r Rule
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return r, err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_RULE_HANDLE:
			r.Handle = ad.Uint64()
		case unix.NFTA_RULE_USERDATA:
			if s, ok := userdata.GetString(ad.Bytes(), userdata.TypeComment); ok {
				r.Comment = s
			}
		case unix.NFTA_RULE_EXPRESSIONS:
			ad.Nested(func(list *netlink.AttributeDecoder) error {
				for list.Next() {
					list.Nested(func(e *netlink.AttributeDecoder) error {
						parseExpr(e, &r)
						return nil
					})
				}
				return nil
			})
		}
	}
	return r, ad.Err()
}

// parseExpr fills r from one expression: a comment match, an xtables
// target or a native masq.
func parseExpr(e *netlink.AttributeDecoder, r *Rule) {
	name := ""
	for e.Next() {
		switch e.Type() {
		case unix.NFTA_EXPR_NAME:
			name = e.String()
			if name == "masq" {
				r.Target = "MASQUERADE"
			}
		case unix.NFTA_EXPR_DATA:
			if name != "match" && name != "target" {
				continue
			}
			e.Nested(func(d *netlink.AttributeDecoder) error {
				var xname string
				var info []byte
				for d.Next() {
					switch d.Type() {
					case unix.NFTA_MATCH_NAME: // == NFTA_TARGET_NAME
						xname = d.String()
					case unix.NFTA_MATCH_INFO: // == NFTA_TARGET_INFO
						info = d.Bytes()
					}
				}
				switch {
				case name == "target":
					r.Target = xname
				case xname == "comment":
					if i := bytes.IndexByte(info, 0); i >= 0 {
						info = info[:i]
					}
					r.Comment = string(info)
				}
				return nil
			})
		}
	}
}

// DeleteRules removes the rules with the given handles from chain in one
// transaction. A rule already gone (another DEL of the same attachment got
// there first) makes the transaction fail as a whole.
func (c *Conn) DeleteRules(f Family, table, chain string, handles []uint64) error {
	if len(handles) == 0 {
		return nil
	}
	t := &nftables.Table{Name: table, Family: tableFamily(f)}
	ch := &nftables.Chain{Name: chain, Table: t}
	for _, h := range handles {
		if err := c.c.DelRule(&nftables.Rule{Table: t, Chain: ch, Handle: h}); err != nil {
			return fmt.Errorf("nf_tables: %w", err)
		}
	}
	if err := c.c.Flush(); err != nil {
		return fmt.Errorf("nf_tables: delete %d rules from %s %s %s: %w", len(handles), famName(f), table, chain, err)
	}
	c.removed = true
	return nil
}

// DeleteTagged removes every rule of chain whose comment sel accepts, in
// one transaction, and reports how many went. A concurrent removal of the
// same rules is tolerated: the chain is read again and what is left removed.
func (c *Conn) DeleteTagged(f Family, table, chain string, sel func(comment string) bool) (int, error) {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var rules []Rule
		rules, err = c.ChainRules(f, table, chain)
		if err != nil {
			return 0, err
		}
		var handles []uint64
		for _, r := range rules {
			if sel(r.Comment) {
				handles = append(handles, r.Handle)
			}
		}
		if err = c.DeleteRules(f, table, chain, handles); err == nil {
			return len(handles), nil
		}
	}
	return 0, err
}

// Tables lists the names of the native nftables tables of family inet.
func (c *Conn) Tables() ([]string, error) {
	objs, err := c.dump(unix.NFT_MSG_GETTABLE, nftables.TableFamilyINet, nil)
	if err != nil {
		return nil, fmt.Errorf("nf_tables: list tables: %w", err)
	}
	var names []string
	for _, o := range objs {
		ad, err := netlink.NewAttributeDecoder(o)
		if err != nil {
			return nil, fmt.Errorf("nf_tables: list tables: %w", err)
		}
		for ad.Next() {
			if ad.Type() == unix.NFTA_TABLE_NAME {
				names = append(names, ad.String())
			}
		}
	}
	return names, nil
}

// DeleteTables deletes the inet tables named, with everything in them, in
// one transaction; a table that is not there is no error (it is added and
// deleted, as `nft 'add table …; delete table …'` does).
func (c *Conn) DeleteTables(names []string) error {
	if len(names) == 0 {
		return nil
	}
	for _, n := range names {
		t := &nftables.Table{Name: n, Family: nftables.TableFamilyINet}
		c.c.AddTable(t)
		c.c.DelTable(t)
	}
	if err := c.c.Flush(); err != nil {
		return fmt.Errorf("nf_tables: delete tables %s: %w", strings.Join(names, ", "), err)
	}
	c.removed = true
	return nil
}
