package firewall

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/nftnl"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// Interface is the firewall as ipmasq, portmap and intercept use it: one
// backend, in the calling thread's network namespace. Host is the real one,
// Fake an in-memory one for tests.
//
// Tables are named by family and name: an iptables table of family V4 is
// (V4.Tables(), "nat"). Reads of a table or chain that is not there return
// nil and no error.
type Interface interface {
	// Backend is the backend this firewall programs.
	Backend() Backend

	// ReadTable reads a table: its chains, in order, with their rules.
	ReadTable(ctx context.Context, fam TableFamily, table string) (*Table, error)
	// ReadTables reads several tables of fam, leaving out those not there:
	// for legacy iptables with one iptables-save, and none at all when
	// the namespace never loaded any of them.
	ReadTables(ctx context.Context, fam TableFamily, names []string) ([]*Table, error)
	// ReadChain reads one chain with its rules (much cheaper than a table
	// on a busy node).
	ReadChain(ctx context.Context, fam TableFamily, table, chain string) (*Chain, error)
	// Tables lists the names of the native nftables tables of fam.
	Tables(ctx context.Context, fam TableFamily) ([]string, error)
	// HasTable and HasChain tell whether a table or chain is there, as
	// cheaply as the backend allows, with no tool run (one netlink
	// request; for legacy iptables, /proc/thread-self/net/ip{,6}_tables_names
	// and, for a chain of a loaded table, one getsockopt).
	HasTable(ctx context.Context, fam TableFamily, table string) (bool, error)
	HasChain(ctx context.Context, fam TableFamily, table, chain string) (bool, error)
	// ChainNames lists the chains of a table, with no tool run: for
	// nf_tables one netlink chain dump; for legacy iptables the built-in
	// chains (in hook order) and the user chains, with one getsockopt,
	// and none without instantiating a table the namespace never loaded.
	// A table that is not there has none (nil, no error; HasTable tells
	// it from an empty one).
	ChainNames(ctx context.Context, fam TableFamily, table string) ([]string, error)

	// Restore applies an iptables-restore --noflush payload to family f
	// as one transaction (iptables backends). A busy xtables lock ends in
	// CNI code 11.
	Restore(ctx context.Context, f Family, payload string) error
	// ApplyNft applies an nft script as one transaction.
	ApplyNft(ctx context.Context, script string) error
	// ReplaceTable writes a native nftables table of meshwire's own whole
	// (ruleset.Table), in one transaction that replaces it, over netlink:
	// it needs no firewall tool.
	ReplaceTable(ctx context.Context, t ruleset.Table) error
	// AppendRules appends typed rules to the chains of an iptables table
	// (of each rule's family) over netlink in one transaction, encoded as
	// iptables-nft encodes them (nf_tables-backed iptables only; a missing
	// table or chain fails it, and the caller uses Restore). Only the
	// shape of meshwire's masquerade rules is encodable (see encode.go).
	AppendRules(ctx context.Context, table string, rules []ruleset.Rule) error
	// DeleteRules removes rules read back (by handle for nf_tables, by
	// their iptables spec for legacy iptables) in one transaction per
	// family; a rule already gone fails it with an error that
	// errors.Is(err, ErrNotFound).
	DeleteRules(ctx context.Context, rules []Rule) error
	// DeleteTables deletes native nftables tables with everything in them
	// in one transaction; a table not there is no error.
	DeleteTables(ctx context.Context, fam TableFamily, names []string) error

	// Release ends the firewall's use. When a netlink transaction removed
	// something, it returns the netlink socket, whose last close waits for
	// the kernel to free what was removed: the caller hands it to a
	// process that outlives it (detach.StartHolding) and closes it.
	// Otherwise nil.
	Release() *os.File
}

// ErrNotFound is what a deletion of something that is not there fails with.
var ErrNotFound = unix.ENOENT

// DeleteMatching removes the rules of a chain that sel accepts, in one
// transaction, and reports how many went. A concurrent removal of some of
// them is tolerated: the chain is read again and what is left removed.
func DeleteMatching(ctx context.Context, fw Interface, fam TableFamily, table, chain string, sel func(Rule) bool) (int, error) {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var c *Chain
		if c, err = fw.ReadChain(ctx, fam, table, chain); err != nil || c == nil {
			return 0, err
		}
		var del []Rule
		for _, r := range c.Rules {
			if sel(r) {
				del = append(del, r)
			}
		}
		if len(del) == 0 {
			return 0, nil
		}
		if err = fw.DeleteRules(ctx, del); err == nil {
			return len(del), nil
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
func (h *Host) netlinkReads(fam TableFamily) bool {
	if fam == IP || fam == IP6 {
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

func tableFamilyOf(fam TableFamily) (Family, error) {
	switch fam {
	case IP:
		return V4, nil
	case IP6:
		return V6, nil
	}
	return 0, fmt.Errorf("%s tables are not iptables tables", fam.Name())
}

func (h *Host) ReadTable(ctx context.Context, fam TableFamily, table string) (*Table, error) {
	if h.netlinkReads(fam) {
		c, err := h.c()
		if err != nil {
			return nil, err
		}
		return readTable(c, fam, table)
	}
	f, err := tableFamilyOf(fam)
	if err != nil {
		return nil, err
	}
	out, err := retryDump(func() (string, error) { return h.b.Save(ctx, f, table) })
	if err != nil {
		return nil, err
	}
	for _, t := range ParseIPTablesSave(f, table, out) {
		if t.Name == table {
			return t, nil
		}
	}
	return nil, nil
}

func (h *Host) ReadTables(ctx context.Context, fam TableFamily, names []string) ([]*Table, error) {
	var out []*Table
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
	have, err := legacyTables(fam)
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
	save, err := retryDump(func() (string, error) { return h.b.Save(ctx, f, table) })
	if err != nil {
		return nil, err
	}
	for _, t := range ParseIPTablesSave(f, table, save) {
		if slices.Contains(loaded, t.Name) {
			out = append(out, t)
		}
	}
	return out, nil
}

func (h *Host) ReadChain(ctx context.Context, fam TableFamily, table, chain string) (*Chain, error) {
	if h.netlinkReads(fam) {
		c, err := h.c()
		if err != nil {
			return nil, err
		}
		return readChain(c, fam, table, chain)
	}
	f, err := tableFamilyOf(fam)
	if err != nil {
		return nil, err
	}
	out, err := retryDump(func() (string, error) { return h.b.ListChain(ctx, f, table, chain) })
	if err != nil {
		if noSuchChain(err) {
			return nil, nil
		}
		return nil, err
	}
	for _, t := range ParseIPTablesSave(f, table, out) {
		if c := t.Chain(chain); c != nil {
			return c, nil
		}
	}
	return &Chain{Family: fam, Table: table, Name: chain, Hook: builtinHook(chain)}, nil
}

// noSuchChain: how iptables says the chain (or table) is not there.
func noSuchChain(err error) bool {
	s := err.Error()
	return strings.Contains(s, "No chain/target/match by that name") || strings.Contains(s, "does not exist") ||
		strings.Contains(s, "Table does not exist")
}

// retryDump repeats a read that iptables-nft abandons when the ruleset
// changes under it ("results may be incomplete or inconsistent"), which
// concurrent ADDs and DELs make common.
func retryDump(fn func() (string, error)) (string, error) {
	var out string
	var err error
	for i := 0; i < 8; i++ {
		out, err = fn()
		if err == nil || !strings.Contains(err.Error(), "incomplete or inconsistent") {
			return out, err
		}
		time.Sleep(time.Duration(i+1) * 5 * time.Millisecond)
	}
	return out, err
}

func (h *Host) Tables(ctx context.Context, fam TableFamily) ([]string, error) {
	c, err := h.c()
	if err != nil {
		return nil, err
	}
	return c.Tables(fam)
}

func (h *Host) HasTable(ctx context.Context, fam TableFamily, table string) (bool, error) {
	if h.netlinkReads(fam) {
		c, err := h.c()
		if err != nil {
			return false, err
		}
		return hasTable(c, fam, table)
	}
	return legacyTableLoaded(fam, table)
}

func (h *Host) HasChain(ctx context.Context, fam TableFamily, table, chain string) (bool, error) {
	if h.netlinkReads(fam) {
		c, err := h.c()
		if err != nil {
			return false, err
		}
		return hasChain(c, fam, table, chain)
	}
	names, err := h.ChainNames(ctx, fam, table)
	return slices.Contains(names, chain), err
}

func (h *Host) ChainNames(ctx context.Context, fam TableFamily, table string) ([]string, error) {
	if h.netlinkReads(fam) {
		c, err := h.c()
		if err != nil {
			return nil, err
		}
		return chainNames(c, fam, table)
	}
	f, err := tableFamilyOf(fam)
	if err != nil {
		return nil, err
	}
	return legacyChainNames(f, table)
}

func (h *Host) Restore(ctx context.Context, f Family, payload string) error {
	return h.b.Restore(ctx, f, payload)
}

func (h *Host) ApplyNft(ctx context.Context, script string) error { return NftApply(ctx, script) }

func (h *Host) AppendRules(ctx context.Context, table string, rules []ruleset.Rule) error {
	if !h.b.NFTablesBacked() {
		return fmt.Errorf("AppendRules needs an nf_tables-backed iptables, have %s", h.b)
	}
	encoded, err := encodeRules(table, rules)
	if err != nil {
		return err
	}
	c, err := h.c()
	if err != nil {
		return err
	}
	return c.AppendRules(encoded)
}

func (h *Host) DeleteRules(ctx context.Context, rules []Rule) error {
	if len(rules) == 0 {
		return nil
	}
	if h.netlinkReads(rules[0].Family) {
		c, err := h.c()
		if err != nil {
			return err
		}
		return deleteHandles(c, rules)
	}
	for _, f := range []Family{V4, V6} {
		payload, err := deletePayload(f, rules)
		if err != nil {
			return err
		}
		if payload == "" {
			continue
		}
		if err := h.b.Restore(ctx, f, payload); err != nil {
			if strings.Contains(err.Error(), "does a matching rule exist") || noSuchChain(err) {
				return fmt.Errorf("%w: %v", ErrNotFound, err)
			}
			return err
		}
	}
	return nil
}

// deletePayload renders the removal of family f's rules as one
// iptables-restore payload ("" when none is of f).
func deletePayload(f Family, rules []Rule) (string, error) {
	var b strings.Builder
	table := ""
	for _, r := range rules {
		if r.Family != f.Tables() {
			continue
		}
		spec, ok := r.IPTablesSpec()
		if !ok {
			return "", fmt.Errorf("rule %d of %s %s has no iptables form to delete it by", r.Position, r.Table, r.Chain)
		}
		if r.Table != table {
			if table != "" {
				b.WriteString("COMMIT\n")
			}
			table = r.Table
			fmt.Fprintf(&b, "*%s\n", table)
		}
		fmt.Fprintf(&b, "-D %s %s\n", r.Chain, spec)
	}
	if table != "" {
		b.WriteString("COMMIT\n")
	}
	return b.String(), nil
}

func (h *Host) DeleteTables(ctx context.Context, fam TableFamily, names []string) error {
	if len(names) == 0 {
		return nil
	}
	c, err := h.c()
	if err != nil {
		return err
	}
	return c.DeleteTables(fam, names)
}
