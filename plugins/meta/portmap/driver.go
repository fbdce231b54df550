package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/filelock"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/killpoint"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// stateDir holds the node-wide lock of the slow paths and the hints that
// say which ADD transaction to try first.
var stateDir = "/run/meshwire/portmap"

const lockTimeout = 10 * time.Second

func lockNode() (*filelock.Lock, error) {
	return filelock.Acquire(filepath.Join(stateDir, "lock"), lockTimeout)
}

// locked runs fn under the node lock.
func locked(fn func() error) error {
	l, err := lockNode()
	if err != nil {
		return err
	}
	defer l.Release()
	return fn()
}

// resolveBackend applies the config on top of the firewall's one
// resolver: a configured backend is used as is; a backend implied by
// options (externalSetMarkChain, conditions) is used with the node's
// iptables variant when the node's backend is of that kind; otherwise the
// node's backend (firewall.Resolve: its cached detection, else Detect).
func resolveBackend(ctx context.Context, c *config) (firewall.Backend, error) {
	if c.Backend != nil {
		return *c.Backend, nil
	}
	det, err := firewall.Resolve(ctx, "")
	switch {
	case err != nil:
		return firewall.Backend{}, cnierr.Wrap(err, "resolve the firewall backend")
	case c.Implied == "" || c.Implied == det.Kind:
		return det, nil
	default:
		return firewall.Backend{Kind: c.Implied}, nil
	}
}

// driver programs one backend through the firewall front door.
type driver interface {
	// add installs an attachment's plans (one transaction per family for
	// iptables, one for both with nftables).
	add(ctx context.Context, a attachment.ID, plans []famPlan) error
	// del removes the attachment, found by any of its keys (the current
	// one first), in the given families. With wantUDP it returns the UDP
	// host ports its rules mapped (for conntrack).
	del(ctx context.Context, keys []string, fams []ruleset.IPVersion, wantUDP bool) (map[ruleset.IPVersion][]int, error)
	// check verifies that the attachment's rules match the plans.
	check(ctx context.Context, a attachment.ID, plans []famPlan) error
	// gc removes attachments of the network that are not in valid (keys).
	gc(ctx context.Context, network string, valid map[string]bool) error
}

func newDriver(fw firewall.Interface) driver {
	if fw.Backend().Kind == firewall.NFTables {
		return &nftDriver{fw: fw}
	}
	return &iptDriver{fw: fw}
}

func isTryAgain(err error) bool { return cnierr.Code(err) == cnierr.CodeTryAgainLater }

// The base hint is a file per backend (and family, for iptables) that
// exists while the base chains are believed to be there.
type baseHint string

func (h baseHint) path() string { return filepath.Join(stateDir, string(h)+".base") }

func (h baseHint) present() bool {
	_, err := os.Stat(h.path())
	return err == nil
}

func (h baseHint) set(present bool) {
	if !present {
		_ = os.Remove(h.path())
		return
	}
	if h.present() {
		return
	}
	if err := os.MkdirAll(stateDir, 0o755); err == nil {
		_ = os.WriteFile(h.path(), nil, 0o644)
	}
}

// firstTry applies the first of two alternative transactions that
// succeeds: the single-transaction ADD onto an existing base, or the one
// that creates the base too; the hint picks which to try first.
func firstTry(hint baseHint, onBase, fresh *ruleset.Tx, apply func(*ruleset.Tx) error) error {
	tries := []*ruleset.Tx{onBase, fresh}
	if !hint.present() {
		tries[0], tries[1] = fresh, onBase
	}
	var err error
	for _, tx := range tries {
		if err = apply(tx); err == nil || isTryAgain(err) {
			break
		}
	}
	if err == nil {
		hint.set(true)
	}
	return err
}

// gcStale picks the attachments of network that are not valid. Chains
// without a tag, or tagged with another network, are not ours to judge.
func gcStale(keys []string, tagOf func(string) string, network string, valid map[string]bool) []string {
	var out []string
	for _, k := range keys {
		if valid[k] {
			continue
		}
		if tagNetwork(tagOf(k)) == attachment.NetworkTag(network) {
			out = append(out, k)
		}
	}
	return out
}

// checkedKey is the key whose chain CHECK compares: the current key's,
// else the first older key's that the table has (an attachment made by an
// earlier meshwire), else the current key (reported missing).
func checkedKey(st *installed.Table, prefix string, a attachment.ID) string {
	if k := presentKeys(st, prefix, a.PortmapKeys()); len(k) > 0 {
		return k[0]
	}
	return a.PortmapKey()
}

// ---- iptables ----

type iptDriver struct{ fw firewall.Interface }

func (d *iptDriver) b() firewall.Backend { return d.fw.Backend() }

// read reads the nat table of family f.
func (d *iptDriver) read(ctx context.Context, f ruleset.IPVersion) (*installed.Table, error) {
	t, err := d.fw.ReadTable(ctx, f.Tables(), "nat")
	if err != nil {
		return nil, cnierr.Wrap(err, "read the %s nat table (IPv%d)", d.b(), f)
	}
	return t, nil
}

// chain reads one chain of the nat table of family f (nil: not there).
func (d *iptDriver) chain(ctx context.Context, f ruleset.IPVersion, name string) (*installed.Chain, error) {
	return d.fw.ReadChain(ctx, f.Tables(), "nat", name)
}

func (d *iptDriver) apply(ctx context.Context, tx *ruleset.Tx) error {
	slog.Debug("firewall transaction", "backend", d.b().String(), "operations", tx.Len())
	return d.fw.Apply(ctx, tx)
}

func (d *iptDriver) hint(f ruleset.IPVersion) baseHint {
	return baseHint(fmt.Sprintf("%s-v%d", d.b(), f))
}

func (d *iptDriver) add(ctx context.Context, a attachment.ID, plans []famPlan) error {
	for _, p := range plans {
		// A wrong hint costs one refused transaction, never a wrong rule.
		err := firstTry(d.hint(p.Family), renderIPTAddNew(p), renderIPTAddFresh(p), func(tx *ruleset.Tx) error {
			return d.apply(ctx, tx)
		})
		if err == nil {
			killpoint.Here(fmt.Sprintf("rules IPv%d", p.Family))
			continue
		}
		if isTryAgain(err) {
			return err
		}
		slog.Debug("single-transaction ADD refused; reading the table", "family", int(p.Family), "error", err)
		if err := d.ensure(ctx, p); err != nil {
			return err
		}
		killpoint.Here(fmt.Sprintf("rules IPv%d", p.Family))
	}
	return nil
}

// ensure is the slow path of ADD, under the node lock.
func (d *iptDriver) ensure(ctx context.Context, p famPlan) error {
	return locked(func() error {
		st, err := d.read(ctx, p.Family)
		if err != nil {
			return err
		}
		if err := d.apply(ctx, renderIPTEnsure(st, p)); err != nil {
			return cnierr.Wrap(err, "install the port mappings (IPv%d, %s)", p.Family, d.b())
		}
		d.hint(p.Family).set(true)
		return nil
	})
}

func (d *iptDriver) del(ctx context.Context, keys []string, fams []ruleset.IPVersion, wantUDP bool) (map[ruleset.IPVersion][]int, error) {
	udp := map[ruleset.IPVersion][]int{}
	for _, f := range fams {
		if wantUDP {
			// The attachment's chain, under the first key that has one.
			for _, k := range keys {
				if c, err := d.chain(ctx, f, iptAttChain(k)); err == nil && c != nil {
					udp[f] = udpPortsOf(c.Rules)[f]
					break
				}
			}
		}
		err := d.apply(ctx, renderIPTDel(f, keys[0]))
		switch {
		case err == nil:
			d.maybeTeardown(ctx, f)
		case isTryAgain(err):
			return nil, err
		default:
			// Not (entirely) there, or made under an older key: remove
			// whatever is, as the table shows it.
			if err := d.remove(ctx, f, keys); err != nil {
				return nil, err
			}
		}
	}
	return udp, nil
}

// remove deletes attachments as the table shows them (and the base when
// nothing is left), under the node lock.
func (d *iptDriver) remove(ctx context.Context, f ruleset.IPVersion, keys []string) error {
	return locked(func() error {
		// With the base: refused as a whole if an ADD (which takes no lock)
		// added an attachment since the read; then again without it.
		var err error
		for _, teardown := range []bool{true, false} {
			var st *installed.Table
			if st, err = d.read(ctx, f); err != nil {
				return err
			}
			tx := renderIPTRemove(f, st, keys, teardown)
			if tx.Empty() {
				return nil
			}
			if err = d.apply(ctx, tx); err == nil {
				if teardown && remaining(attachmentKeys(st, iptPrefix), keys) == 0 {
					d.hint(f).set(false)
				}
				return nil
			}
			if isTryAgain(err) {
				break
			}
		}
		return cnierr.Wrap(err, "remove port mappings (IPv%d, %s)", f, d.b())
	})
}

// maybeTeardown removes the base when the top chain is empty. The probe
// reads one chain; the teardown itself runs under the node lock and is
// refused by the kernel if an attachment was added meanwhile.
func (d *iptDriver) maybeTeardown(ctx context.Context, f ruleset.IPVersion) {
	top, err := d.chain(ctx, f, iptTop)
	if err != nil || top == nil || len(top.Rules) > 0 {
		return
	}
	if err := d.remove(ctx, f, nil); err != nil {
		slog.Info("base chains kept", "family", int(f), "reason", err)
	}
}

func (d *iptDriver) check(ctx context.Context, a attachment.ID, plans []famPlan) error {
	for _, p := range plans {
		st, err := d.read(ctx, p.Family)
		if err != nil {
			return err
		}
		ch := iptAttChain(checkedKey(st, iptPrefix, a))
		switch {
		case st.Chain(ch) == nil:
			return cnierr.CheckFailed("IPv%d: chain %s of this attachment is missing (%s)", p.Family, ch, d.b())
		case len(jumps(st, iptTop, ch)) != 1:
			return cnierr.CheckFailed("IPv%d: %s has %d jumps to %s, want 1", p.Family, iptTop, len(jumps(st, iptTop, ch)), ch)
		case len(jumps(st, "PREROUTING", iptTop)) == 0 || len(jumps(st, "OUTPUT", iptTop)) == 0:
			return cnierr.CheckFailed("IPv%d: PREROUTING or OUTPUT does not jump to %s", p.Family, iptTop)
		case p.MarkBit >= 0 && (st.Chain(iptMarkChain(p.MarkBit)) == nil || len(jumps(st, "POSTROUTING", iptMasq)) == 0):
			return cnierr.CheckFailed("IPv%d: the masquerade chains for mark bit %d are missing", p.Family, p.MarkBit)
		}
		if got, want := mappingSigs(rulesOf(st, ch)), planSigs(p); !slices.Equal(got, want) {
			return cnierr.CheckFailed("IPv%d: port mappings in %s are %v, want %v", p.Family, ch, got, want)
		}
	}
	return nil
}

func (d *iptDriver) gc(ctx context.Context, network string, valid map[string]bool) error {
	for _, f := range []ruleset.IPVersion{ruleset.V4, ruleset.V6} {
		st, err := d.read(ctx, f)
		if err != nil {
			return err
		}
		keys := attachmentKeys(st, iptPrefix)
		stale := gcStale(keys, func(k string) string { return iptTag(st, k) }, network, valid)
		if len(stale) == 0 && (len(keys) > 0 || !iptHasBase(st)) {
			continue
		}
		slog.Info("gc", "family", int(f), "stale", stale)
		if err := d.remove(ctx, f, stale); err != nil {
			return err
		}
	}
	return nil
}

// ---- nftables ----

type nftDriver struct{ fw firewall.Interface }

const nftHint = baseHint("nftables")

func (d *nftDriver) apply(ctx context.Context, tx *ruleset.Tx) error {
	slog.Debug("firewall transaction", "backend", "nftables", "operations", tx.Len())
	return d.fw.Apply(ctx, tx)
}

// read reads the table (nil: not there).
func (d *nftDriver) read(ctx context.Context) (*installed.Table, error) {
	t, err := d.fw.ReadTable(ctx, ruleset.Inet, nftTable)
	if err != nil {
		return nil, cnierr.Wrap(err, "read nftables table %s", nftFQ)
	}
	return t, nil
}

// chain reads one chain of the table (nil: no table or no chain).
func (d *nftDriver) chain(ctx context.Context, name string) (*installed.Chain, error) {
	c, err := d.fw.ReadChain(ctx, ruleset.Inet, nftTable, name)
	if err != nil {
		return nil, cnierr.Wrap(err, "read nftables chain %s %s", nftFQ, name)
	}
	return c, nil
}

func (d *nftDriver) add(ctx context.Context, a attachment.ID, plans []famPlan) error {
	if len(plans) == 0 {
		return nil
	}
	err := firstTry(nftHint, renderNFTAddNew(a, plans), renderNFTAddFresh(a, plans), func(tx *ruleset.Tx) error {
		return d.apply(ctx, tx)
	})
	if err == nil || isTryAgain(err) {
		return err
	}
	slog.Debug("single-transaction ADD refused; reading the table", "error", err)
	return locked(func() error {
		st, err := d.read(ctx)
		if err != nil {
			return err
		}
		if err := d.apply(ctx, renderNFTEnsure(st, a, plans)); err != nil {
			return cnierr.Wrap(err, "install the port mappings (nftables)")
		}
		nftHint.set(true)
		return nil
	})
}

func (d *nftDriver) del(ctx context.Context, keys []string, _ []ruleset.IPVersion, wantUDP bool) (map[ruleset.IPVersion][]int, error) {
	udp := map[ruleset.IPVersion][]int{}
	hp, err := d.chain(ctx, nftHostports)
	if err != nil || hp == nil {
		return udp, err // no table: nothing of anyone's is left
	}
	chains := []*installed.Chain{hp}
	var present []string
	mine := 0
	for _, k := range keys {
		ch := nftAttChain(k)
		n := len(jumpsIn(hp.Rules, ch))
		if n == 0 {
			continue
		}
		present, mine = append(present, k), mine+n
		// The jump exists, so the chain does (the kernel refuses jumps to
		// missing chains); it is read only for its UDP ports.
		c := &installed.Chain{Name: ch}
		if wantUDP {
			if read, err := d.chain(ctx, ch); err == nil && read != nil {
				c = read
				mergePorts(udp, udpPortsOf(c.Rules))
			}
		}
		chains = append(chains, c)
	}
	if len(present) == 0 {
		return udp, nil // this attachment is not in the table (already deleted)
	}
	teardown := len(hp.Rules) == mine
	err = d.apply(ctx, renderNFTRemove(tableOf(nftTable, chains...), present, teardown))
	switch {
	case err == nil && teardown:
		d.forget()
		return udp, nil
	case err == nil:
		// Others were listed; they may have gone meanwhile (concurrent
		// DELs each see the others), so try the teardown the anchor guards.
		d.tryTeardown(ctx)
		return udp, nil
	case isTryAgain(err):
		return nil, err
	}
	// A concurrent change (or a teardown the anchor refused): redo under
	// the lock from a full read.
	return udp, d.remove(ctx, keys)
}

// tryTeardown deletes the table if no attachment chain is left: one
// transaction that the kernel refuses while any refers to the anchor.
func (d *nftDriver) tryTeardown(ctx context.Context) {
	_ = locked(func() error {
		if err := d.apply(ctx, nftTeardown()); err != nil {
			slog.Debug("table kept", "reason", err)
			return nil
		}
		d.forget()
		return nil
	})
}

// forget drops the hint once the table is gone.
func (d *nftDriver) forget() { nftHint.set(false) }

func (d *nftDriver) remove(ctx context.Context, keys []string) error {
	return locked(func() error {
		var err error
		for _, teardown := range []bool{true, false} {
			var st *installed.Table
			if st, err = d.read(ctx); err != nil {
				return err
			}
			var present []string
			for _, k := range keys {
				if st.Chain(nftAttChain(k)) != nil || len(jumps(st, nftHostports, nftAttChain(k))) > 0 {
					present = append(present, k)
				}
			}
			teardown = teardown && remaining(attachmentKeys(st, nftPrefix), present) == 0
			tx := renderNFTRemove(st, present, teardown)
			if tx.Empty() {
				return nil
			}
			if err = d.apply(ctx, tx); err == nil {
				if teardown {
					d.forget()
				}
				return nil
			}
			if isTryAgain(err) {
				break
			}
		}
		return cnierr.Wrap(err, "remove port mappings (nftables)")
	})
}

func (d *nftDriver) check(ctx context.Context, a attachment.ID, plans []famPlan) error {
	if len(plans) == 0 {
		return nil
	}
	st, err := d.read(ctx)
	if err != nil {
		return err
	}
	ch := nftAttChain(checkedKey(st, nftPrefix, a))
	c := st.Chain(ch)
	switch {
	case c == nil:
		return cnierr.CheckFailed("nftables chain %s of this attachment is missing", ch)
	case len(jumps(st, nftHostports, ch)) != 1:
		return cnierr.CheckFailed("nftables chain %s has %d jumps to %s, want 1", nftHostports, len(jumps(st, nftHostports, ch)), ch)
	case len(jumps(st, "prerouting", nftHostports)) == 0 || len(jumps(st, "output", nftHostports)) == 0:
		return cnierr.CheckFailed("nftables prerouting or output does not jump to %s", nftHostports)
	}
	var want []string
	for _, p := range plans {
		want = append(want, planSigs(p)...)
	}
	sort.Strings(want)
	if got := mappingSigs(c.Rules); !slices.Equal(got, want) {
		return cnierr.CheckFailed("port mappings in nftables chain %s are %v, want %v", ch, got, want)
	}
	return nil
}

func (d *nftDriver) gc(ctx context.Context, network string, valid map[string]bool) error {
	st, err := d.read(ctx)
	if err != nil || st == nil {
		return err
	}
	tagOf := func(k string) string {
		if c := st.Chain(nftAttChain(k)); c != nil {
			return c.Comment
		}
		return ""
	}
	keys := attachmentKeys(st, nftPrefix)
	stale := gcStale(keys, tagOf, network, valid)
	if len(stale) == 0 && len(keys) > 0 {
		return nil
	}
	slog.Info("gc", "stale", stale)
	return d.remove(ctx, stale)
}
