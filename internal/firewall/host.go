package firewall

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/firewall/fwnetlink"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/nftnl"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// Interface is the firewall as ipmasq, portmap, refrules, bridge and
// intercept use it: one backend, in the calling thread's network
// namespace. Host is the real one; fwfake.Fake an in-memory one for
// tests. Writes are typed transactions (ruleset.Tx); reads give back
// package installed's typed tables, chains and rules. A caller that needs
// less takes a smaller interface (Reader, Writer).
//
// Tables are named by family and name: an iptables table of family V4 is
// (IP, "nat"). Reads of a table or chain that is not there return nil and
// no error.
type Interface interface {
	Writer
	Reader
	// Release ends the firewall's use. When a netlink transaction removed
	// something, it returns the netlink socket, whose last close waits for
	// the kernel to free what was removed: the caller hands it to a
	// process that outlives it (detach.StartHolding) and closes it.
	// Otherwise nil.
	Release() *os.File
}

// Writer applies transactions.
type Writer interface {
	// Backend is the backend this firewall programs.
	Backend() Backend
	// Apply applies tx as one transaction, written the cheapest way the
	// backend allows (Route): over netlink when every operation is one
	// netlink writes with no tool, else one nft -f, or one
	// iptables-restore --noflush per address family (IPv4 first; a
	// transaction of both families is one per family).
	// A busy xtables lock ends in CNI code 11; a rule or chain to delete
	// that is not there fails with an error that errors.Is(err,
	// ErrNotFound).
	Apply(ctx context.Context, tx *ruleset.Tx) error
}

// Reader reads what the firewall holds.
type Reader interface {
	Backend() Backend
	// ReadTable reads a table: its chains, in order, with their rules.
	ReadTable(ctx context.Context, fam ruleset.Family, table string) (*installed.Table, error)
	// ReadTables reads several tables of fam, leaving out those not there:
	// for legacy iptables with one iptables-save, and none at all when
	// the namespace never loaded any of them.
	ReadTables(ctx context.Context, fam ruleset.Family, names []string) ([]*installed.Table, error)
	// ReadChain reads one chain with its rules (much cheaper than a table
	// on a busy node).
	ReadChain(ctx context.Context, fam ruleset.Family, table, chain string) (*installed.Chain, error)
	// Tables lists the names of the native nftables tables of fam.
	Tables(ctx context.Context, fam ruleset.Family) ([]string, error)
	// HasTable and HasChain tell whether a table or chain is there, as
	// cheaply as the backend allows, with no tool run (one netlink
	// request; for legacy iptables, /proc/thread-self/net/ip{,6}_tables_names
	// and, for a chain of a loaded table, one getsockopt).
	HasTable(ctx context.Context, fam ruleset.Family, table string) (bool, error)
	HasChain(ctx context.Context, fam ruleset.Family, table, chain string) (bool, error)
	// ReadSet reads a set: of a native nftables table, or an ipset
	// (ruleset.IPSets); nil when it is not there.
	ReadSet(ctx context.Context, id ruleset.TableID, name string) (*installed.Set, error)
	// ChainNames lists the chains of a table, with no tool run: for
	// nf_tables one netlink chain dump; for legacy iptables the built-in
	// chains (in hook order) and the user chains, with one getsockopt,
	// and none without instantiating a table the namespace never loaded.
	// A table that is not there has none (nil, no error; HasTable tells
	// it from an empty one).
	ChainNames(ctx context.Context, fam ruleset.Family, table string) ([]string, error)
}

// ErrNotFound is what a deletion of something that is not there fails with.
var ErrNotFound = unix.ENOENT

// DeleteMatching removes the rules of a chain that sel accepts, in one
// transaction, and reports how many went. A concurrent removal of some of
// them is tolerated: the chain is read again and what is left removed.
func DeleteMatching(ctx context.Context, fw Interface, fam ruleset.Family, table, chain string, sel func(installed.Rule) bool) (int, error) {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var c *installed.Chain
		if c, err = fw.ReadChain(ctx, fam, table, chain); err != nil || c == nil {
			return 0, err
		}
		tx := &ruleset.Tx{}
		id := ruleset.TableID{Family: fam, Name: table}
		for _, r := range c.Rules {
			if sel(r) {
				tx.DeleteRef(id, fwtext.Ref(r))
			}
		}
		if tx.Empty() {
			return 0, nil
		}
		if err = fw.Apply(ctx, tx); err == nil {
			return tx.Len(), nil
		}
		if !errors.Is(err, ErrNotFound) {
			return 0, err
		}
	}
	return 0, err
}

// Host is the real firewall: the backend's tools, and netlink for
// everything that lives in nf_tables. It opens one netlink connection on
// first use, in the namespace of the calling thread, which must not change
// until Release.
type Host struct {
	b  Backend
	nl *netlinkConn // shared with the Host's siblings
}

// netlinkConn is the one netlink connection of a Host and its siblings.
type netlinkConn struct{ conn *nftnl.Conn }

// New returns the firewall of backend b in the calling thread's network
// namespace.
func New(b Backend) *Host { return &Host{b: b, nl: &netlinkConn{}} }

// Sibling returns the firewall of backend b in the same namespace, sharing
// h's netlink connection: one Release of either covers both. A second
// socket would cost its process the kernel's wait at close (see
// nftnl.Conn) for whatever the first one removed, about 10 ms on every DEL
// that also looks for the reference plugins' rules.
func (h *Host) Sibling(b Backend) *Host { return &Host{b: b, nl: h.nl} }

func (h *Host) Backend() Backend { return h.b }

// netlinkReads: the tables of fam live in nf_tables (and are read over
// netlink) for native nftables, and for iptables tables of an
// nf_tables-backed iptables.
func (h *Host) netlinkReads(fam ruleset.Family) bool {
	if fam == ruleset.IP || fam == ruleset.IP6 {
		return h.b.Kind == NFTables || h.b.NFTablesBacked()
	}
	return true
}

func (h *Host) c() (*nftnl.Conn, error) {
	if h.nl.conn == nil {
		c, err := nftnl.Open()
		if err != nil {
			return nil, err
		}
		h.nl.conn = c
	}
	return h.nl.conn, nil
}

func (h *Host) Release() *os.File {
	if h.nl.conn == nil {
		return nil
	}
	f := h.nl.conn.Release()
	h.nl.conn = nil
	return f
}

// Close ends the firewall's use, waiting here for the kernel when a
// removal was committed (Release without a process to hand the wait to).
func (h *Host) Close() {
	if f := h.Release(); f != nil {
		_ = f.Close()
	}
}

func tableFamilyOf(fam ruleset.Family) (ruleset.IPVersion, error) {
	switch fam {
	case ruleset.IP:
		return ruleset.V4, nil
	case ruleset.IP6:
		return ruleset.V6, nil
	}
	return 0, fmt.Errorf("%s tables are not iptables tables", fam.Name())
}

func (h *Host) ReadTable(ctx context.Context, fam ruleset.Family, table string) (*installed.Table, error) {
	if h.netlinkReads(fam) {
		c, err := h.c()
		if err != nil {
			return nil, err
		}
		return fwnetlink.ReadTable(c, fam, table)
	}
	f, err := tableFamilyOf(fam)
	if err != nil {
		return nil, err
	}
	out, err := h.b.Save(ctx, f, table)
	if err != nil {
		return nil, err
	}
	for _, t := range fwtext.ParseIPTablesSave(f, table, out) {
		if t.Name == table {
			return t, nil
		}
	}
	return nil, nil
}

func (h *Host) ReadTables(ctx context.Context, fam ruleset.Family, names []string) ([]*installed.Table, error) {
	var out []*installed.Table
	if h.netlinkReads(fam) {
		for _, n := range names {
			t, err := h.ReadTable(ctx, fam, n)
			if err != nil {
				return nil, err
			}
			if t != nil {
				out = append(out, t)
			}
		}
		return out, nil
	}
	f, err := tableFamilyOf(fam)
	if err != nil {
		return nil, err
	}
	have, err := fwtext.LegacyTables(fam)
	if err != nil {
		return nil, err
	}
	var loaded []string
	for _, n := range names {
		if slices.Contains(have, n) {
			loaded = append(loaded, n)
		}
	}
	table := "" // every table loaded, in one run
	switch len(loaded) {
	case 0:
		return nil, nil
	case 1:
		table = loaded[0]
	}
	save, err := h.b.Save(ctx, f, table)
	if err != nil {
		return nil, err
	}
	for _, t := range fwtext.ParseIPTablesSave(f, table, save) {
		if slices.Contains(loaded, t.Name) {
			out = append(out, t)
		}
	}
	return out, nil
}

func (h *Host) ReadChain(ctx context.Context, fam ruleset.Family, table, chain string) (*installed.Chain, error) {
	if h.netlinkReads(fam) {
		c, err := h.c()
		if err != nil {
			return nil, err
		}
		return fwnetlink.ReadChain(c, fam, table, chain)
	}
	f, err := tableFamilyOf(fam)
	if err != nil {
		return nil, err
	}
	// A chain that is not there is nil: told by the table's chains (one
	// getsockopt, no tool), before the tool's read and, for a chain
	// removed meanwhile, after its failure.
	if ok, err := h.HasChain(ctx, fam, table, chain); err != nil || !ok {
		return nil, err
	}
	out, err := h.b.ListChain(ctx, f, table, chain)
	if err != nil {
		if ok, herr := h.HasChain(ctx, fam, table, chain); herr == nil && !ok {
			return nil, nil
		}
		return nil, err
	}
	for _, t := range fwtext.ParseIPTablesSave(f, table, out) {
		if c := t.Chain(chain); c != nil {
			return c, nil
		}
	}
	return &installed.Chain{Family: fam, Table: table, Name: chain, Hook: ruleset.BuiltinHook(chain)}, nil
}

func (h *Host) Tables(ctx context.Context, fam ruleset.Family) ([]string, error) {
	c, err := h.c()
	if err != nil {
		return nil, err
	}
	return c.Tables(fam)
}

func (h *Host) HasTable(ctx context.Context, fam ruleset.Family, table string) (bool, error) {
	if h.netlinkReads(fam) {
		c, err := h.c()
		if err != nil {
			return false, err
		}
		return fwnetlink.HasTable(c, fam, table)
	}
	return fwtext.LegacyTableLoaded(fam, table)
}

func (h *Host) HasChain(ctx context.Context, fam ruleset.Family, table, chain string) (bool, error) {
	if h.netlinkReads(fam) {
		c, err := h.c()
		if err != nil {
			return false, err
		}
		return fwnetlink.HasChain(c, fam, table, chain)
	}
	names, err := h.ChainNames(ctx, fam, table)
	return slices.Contains(names, chain), err
}

func (h *Host) ChainNames(ctx context.Context, fam ruleset.Family, table string) ([]string, error) {
	if h.netlinkReads(fam) {
		c, err := h.c()
		if err != nil {
			return nil, err
		}
		return fwnetlink.ChainNames(c, fam, table)
	}
	f, err := tableFamilyOf(fam)
	if err != nil {
		return nil, err
	}
	return fwtext.LegacyChainNames(f, table)
}

func (h *Host) ReadSet(ctx context.Context, id ruleset.TableID, name string) (*installed.Set, error) {
	if id.IsIPSets() {
		f, err := tableFamilyOf(id.Family)
		if err != nil {
			return nil, err
		}
		return readIPSet(f, name)
	}
	c, err := h.c()
	if err != nil {
		return nil, err
	}
	return fwnetlink.ReadSet(c, id, name)
}

// Route names how a transaction is written on backend b: "netlink" when
// every operation is one that netlink writes with no tool (fwnetlink.Encode;
// rules appended to iptables tables only when b's live in nf_tables),
// else "restore v4" or "restore v6" (one iptables-restore) for iptables,
// "nft" (one nft -f) for nftables; the ipsets' operations are "ipset"
// (netlink, one operation at a time), and a transaction with them and
// others is each run's route in turn, joined by ", ". The fake names its
// transactions the same way.
func Route(b Backend, tx *ruleset.Tx) string {
	var r []string
	for _, part := range fwtext.SplitIPSets(tx) {
		switch _, ok := fwnetlink.Encode(part, b.NFTablesBacked()); {
		case fwtext.IsIPSets(part):
			r = append(r, "ipset")
		case ok:
			r = append(r, "netlink")
		default:
			r = append(r, ToolRoute(b, part))
		}
	}
	return strings.Join(r, ", ")
}

// ToolRoute names how tx is written on backend b by its tool.
func ToolRoute(b Backend, tx *ruleset.Tx) string {
	if b.Kind == NFTables {
		return "nft"
	}
	var r []string
	for _, part := range fwtext.ByFamily(tx) {
		v, _ := fwtext.IPTablesFamily(part)
		r = append(r, fmt.Sprintf("restore v%d", int(v)))
	}
	return strings.Join(r, ", ")
}

// Apply writes tx (refused whole when its building failed: Tx.Err): its
// ipset operations over netlink, the rest over netlink when Route says
// so, else with the tool. Rules appended over netlink to an iptables
// table that is not there yet (iptables-nft makes its tables on first
// use) go through iptables-restore instead.
func (h *Host) Apply(ctx context.Context, tx *ruleset.Tx) error {
	if err := tx.Err(); err != nil {
		return err
	}
	for _, part := range fwtext.SplitIPSets(tx) {
		var err error
		if fwtext.IsIPSets(part) {
			err = applyIPSets(part)
		} else {
			err = h.apply(ctx, part)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// apply writes tx, which holds no ipset operation.
func (h *Host) apply(ctx context.Context, tx *ruleset.Tx) error {
	if batch, ok := fwnetlink.Encode(tx, h.b.NFTablesBacked()); ok {
		c, err := h.c()
		if err == nil {
			err = batch.Apply(c)
		}
		if err == nil || !tx.OnlyAddsRules() {
			return err
		}
	}
	if h.b.Kind == NFTables {
		tx, err := h.present(ctx, tx)
		if err != nil || tx.Empty() {
			return err
		}
		script, err := fwtext.NftScript(tx)
		if err != nil {
			return err
		}
		return h.notFound(ctx, tx, NftApply(ctx, script))
	}
	for _, part := range fwtext.ByFamily(tx) {
		v, err := fwtext.IPTablesFamily(part)
		if err != nil {
			return err
		}
		payload, err := fwtext.IPTablesRestore(part)
		if err != nil {
			return err
		}
		if err := h.notFound(ctx, part, h.b.Restore(ctx, v, payload)); err != nil {
			return err
		}
	}
	return nil
}

// present narrows tx's element removals to the elements the sets hold
// (nft fails on one that is not there, and only recent versions have
// "destroy element"): a removal of none, or from a set that is not
// there, goes.
func (h *Host) present(ctx context.Context, tx *ruleset.Tx) (*ruleset.Tx, error) {
	out := &ruleset.Tx{}
	for _, o := range tx.Ops() {
		if o.Object() != "element" || o.Verb != ruleset.Destroy {
			out.AppendOps(o)
			continue
		}
		s, err := h.ReadSet(ctx, o.Table, o.Set.Name)
		if err != nil {
			return nil, err
		}
		var keep []ruleset.Element
		for _, e := range o.Elements {
			if s.Has(e.Addr) {
				keep = append(keep, e)
			}
		}
		if len(keep) > 0 {
			o.Elements = keep
			out.AppendOps(o)
		}
	}
	return out, nil
}

// notFound marks the failure err of tx's tool as ErrNotFound when
// something tx deletes is not there now: a chain, or a rule (by its
// handle or its iptables form), as the firewall reads them back. The
// tools' messages are not read.
func (h *Host) notFound(ctx context.Context, tx *ruleset.Tx, err error) error {
	if err == nil {
		return nil
	}
	for _, o := range tx.Ops() {
		if o.Verb != ruleset.Delete {
			continue
		}
		switch o.Object() {
		case "chain":
			if ok, herr := h.HasChain(ctx, o.Table.Family, o.Table.Name, o.Chain.Name); herr == nil && !ok {
				return fmt.Errorf("%w: %v", ErrNotFound, err)
			}
		case "rule":
			if gone, herr := h.ruleGone(ctx, o); herr == nil && gone {
				return fmt.Errorf("%w: %v", ErrNotFound, err)
			}
		}
	}
	return err
}

// ruleGone tells whether the rule a deletion names by its read-back
// reference is not in its chain (a rule named by its form is not told:
// the tools normalize what they print).
func (h *Host) ruleGone(ctx context.Context, o ruleset.Op) (bool, error) {
	if o.Ref == nil {
		return false, nil
	}
	c, err := h.ReadChain(ctx, o.Table.Family, o.Table.Name, o.ChainName())
	if err != nil || c == nil {
		return c == nil, err
	}
	for _, r := range c.Rules {
		ref := fwtext.Ref(r)
		switch {
		case o.Ref.Handle != 0 && ref.Handle == o.Ref.Handle,
			o.Ref.Handle == 0 && o.Ref.Spec != "" && ref.Spec == o.Ref.Spec,
			o.Ref.Handle == 0 && o.Ref.Spec == "" && ref.Position == o.Ref.Position:
			return false, nil
		}
	}
	return true, nil
}
