package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/filelock"
	"github.com/meshwire/meshwire/internal/firewall"
)

// stateDir holds the node-wide lock of the slow paths and the backend that
// auto-detection picked (so that every later command uses the same one
// without detecting again, which reads every ruleset of the node).
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

func backendCachePath() string { return filepath.Join(stateDir, "backend") }

// readBackendCache returns the backend a previous ADD detected, if any.
func readBackendCache() (firewall.Backend, bool) {
	b, err := os.ReadFile(backendCachePath())
	if err != nil {
		return firewall.Backend{}, false
	}
	be, err := firewall.Parse(strings.TrimSpace(string(b)))
	return be, err == nil
}

func writeBackendCache(b firewall.Backend) {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		slog.Warn("cannot remember the detected backend", "error", err)
		return
	}
	tmp := backendCachePath() + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()+"\n"), 0o644); err == nil {
		err = os.Rename(tmp, backendCachePath())
		if err != nil {
			slog.Warn("cannot remember the detected backend", "error", err)
		}
	}
}

func removeBackendCache() { _ = os.Remove(backendCachePath()) }

// resolved is the backend a command works with.
type resolved struct {
	firewall.Backend
	auto bool // chosen by detection, not by the config
}

// resolveBackend applies the config: a configured backend is used as is; a
// backend implied by options (externalSetMarkChain, conditions) is used
// with the detected iptables variant; otherwise the remembered detection,
// else a fresh firewall.Detect.
func resolveBackend(ctx context.Context, c *config) resolved {
	if c.Backend != nil {
		return resolved{Backend: *c.Backend}
	}
	det, ok := readBackendCache()
	if !ok {
		det = firewall.Detect(ctx)
	}
	switch {
	case c.Implied == "":
		return resolved{Backend: det, auto: true}
	case c.Implied == det.Kind:
		return resolved{Backend: det}
	default:
		return resolved{Backend: firewall.Backend{Kind: c.Implied}}
	}
}

// driver programs one backend.
type driver interface {
	// add installs an attachment's plans (one transaction per family for
	// iptables, one for both with nftables).
	add(ctx context.Context, a attachment.ID, plans []famPlan) error
	// del removes the attachment in the given families. With wantUDP it
	// returns the UDP host ports its rules mapped (for conntrack).
	del(ctx context.Context, key string, fams []firewall.Family, wantUDP bool) (map[firewall.Family][]int, error)
	// check verifies that the attachment's rules match the plans.
	check(ctx context.Context, a attachment.ID, plans []famPlan) error
	// gc removes attachments of the network that are not in valid (keys).
	gc(ctx context.Context, network string, valid map[string]bool) error
}

func newDriver(r resolved) driver {
	if r.Kind == firewall.NFTables {
		return &nftDriver{auto: r.auto}
	}
	return &iptDriver{b: r.Backend, auto: r.auto}
}

func isTryAgain(err error) bool { return cnierr.Code(err) == cnierr.CodeTryAgainLater }

// ---- iptables ----

type iptDriver struct {
	b    firewall.Backend
	auto bool
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

func (d *iptDriver) listChain(ctx context.Context, f firewall.Family, chain string) (string, error) {
	return retryDump(func() (string, error) { return d.b.ListChain(ctx, f, "nat", chain) })
}

func (d *iptDriver) read(ctx context.Context, f firewall.Family) (*iptState, error) {
	out, err := retryDump(func() (string, error) { return d.b.Save(ctx, f, "nat") })
	if err != nil {
		return nil, cnierr.Wrap(err, "read the %s nat table (IPv%d)", d.b, f)
	}
	return parseIPTSave(out), nil
}

func (d *iptDriver) restore(ctx context.Context, f firewall.Family, payload string) error {
	slog.Debug("iptables-restore", "backend", d.b.String(), "family", int(f), "payload", payload)
	return d.b.Restore(ctx, f, payload)
}

func (d *iptDriver) add(ctx context.Context, a attachment.ID, plans []famPlan) error {
	for _, p := range plans {
		// A wrong hint costs one refused transaction, never a wrong rule.
		err := firstTry(d.hint(p.Family), renderIPTAddNew(p), renderIPTAddFresh(p), func(payload string) error {
			return d.restore(ctx, p.Family, payload)
		})
		if err == nil {
			continue
		}
		if isTryAgain(err) {
			return err
		}
		slog.Debug("single-transaction ADD refused; reading the table", "family", int(p.Family), "error", err)
		if err := d.ensure(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

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

func (d *iptDriver) hint(f firewall.Family) baseHint {
	return baseHint(fmt.Sprintf("%s-v%d", d.b, f))
}

// firstTry applies the first of two alternative transactions that
// succeeds: the single-transaction ADD onto an existing base, or the one
// that creates the base too; the hint picks which to try first.
func firstTry(hint baseHint, onBase, fresh string, apply func(string) error) error {
	tries := []string{onBase, fresh}
	if !hint.present() {
		tries[0], tries[1] = fresh, onBase
	}
	var err error
	for _, payload := range tries {
		if err = apply(payload); err == nil || isTryAgain(err) {
			break
		}
	}
	if err == nil {
		hint.set(true)
	}
	return err
}

// ensure is the slow path of ADD, under the node lock.
func (d *iptDriver) ensure(ctx context.Context, p famPlan) error {
	return locked(func() error {
		st, err := d.read(ctx, p.Family)
		if err != nil {
			return err
		}
		if err := d.restore(ctx, p.Family, renderIPTEnsure(st, p)); err != nil {
			return cnierr.Wrap(err, "install the port mappings (IPv%d, %s)", p.Family, d.b)
		}
		d.hint(p.Family).set(true)
		if d.auto {
			writeBackendCache(d.b)
		}
		return nil
	})
}

func (d *iptDriver) del(ctx context.Context, key string, fams []firewall.Family, wantUDP bool) (map[firewall.Family][]int, error) {
	udp := map[firewall.Family][]int{}
	for _, f := range fams {
		if wantUDP {
			if out, err := d.listChain(ctx, f, iptAttChain(key)); err == nil {
				udp[f] = iptUDPPorts(strings.Split(out, "\n"))
			}
		}
		err := d.restore(ctx, f, renderIPTDel(key))
		switch {
		case err == nil:
			d.maybeTeardown(ctx, f)
		case isTryAgain(err):
			return nil, err
		default:
			// Not (entirely) there: remove whatever is, as the table shows it.
			if err := d.remove(ctx, f, []string{key}); err != nil {
				return nil, err
			}
		}
	}
	return udp, nil
}

// remove deletes attachments as the table shows them (and the base when
// nothing is left), under the node lock.
func (d *iptDriver) remove(ctx context.Context, f firewall.Family, keys []string) error {
	return locked(func() error {
		// With the base: refused as a whole if an ADD (which takes no lock)
		// added an attachment since the read; then again without it.
		var err error
		for _, teardown := range []bool{true, false} {
			var st *iptState
			if st, err = d.read(ctx, f); err != nil {
				return err
			}
			payload := renderIPTRemove(st, keys, teardown)
			if payload == "" {
				return nil
			}
			if err = d.restore(ctx, f, payload); err == nil {
				empty := teardown && remaining(st.attachments(), keys) == 0
				if empty {
					d.hint(f).set(false)
				}
				d.forgetBackendIfEmpty(ctx, f, empty)
				return nil
			}
			if isTryAgain(err) {
				break
			}
		}
		return cnierr.Wrap(err, "remove port mappings (IPv%d, %s)", f, d.b)
	})
}

// maybeTeardown removes the base when the top chain is empty. The probe
// reads one chain; the teardown itself runs under the node lock and is
// refused by the kernel if an attachment was added meanwhile.
func (d *iptDriver) maybeTeardown(ctx context.Context, f firewall.Family) {
	out, err := d.listChain(ctx, f, iptTop)
	if err != nil || strings.Contains(out, "-A ") {
		return
	}
	if err := d.remove(ctx, f, nil); err != nil {
		slog.Info("base chains kept", "family", int(f), "reason", err)
	}
}

// forgetBackendIfEmpty drops the remembered detection once neither family
// has meshwire port mappings left in this backend.
func (d *iptDriver) forgetBackendIfEmpty(ctx context.Context, f firewall.Family, empty bool) {
	if !d.auto || !empty {
		return
	}
	other := firewall.V6
	if f == firewall.V6 {
		other = firewall.V4
	}
	if _, err := d.listChain(ctx, other, iptTop); err != nil {
		removeBackendCache()
	}
}

func (d *iptDriver) check(ctx context.Context, a attachment.ID, plans []famPlan) error {
	for _, p := range plans {
		st, err := d.read(ctx, p.Family)
		if err != nil {
			return err
		}
		ch := iptAttChain(p.Key)
		switch {
		case !st.chains[ch]:
			return cnierr.CheckFailed("IPv%d: chain %s of this attachment is missing (%s)", p.Family, ch, d.b)
		case len(st.jumpsTo(iptTop, ch)) != 1:
			return cnierr.CheckFailed("IPv%d: %s has %d jumps to %s, want 1", p.Family, iptTop, len(st.jumpsTo(iptTop, ch)), ch)
		case len(st.jumpsTo("PREROUTING", iptTop)) == 0 || len(st.jumpsTo("OUTPUT", iptTop)) == 0:
			return cnierr.CheckFailed("IPv%d: PREROUTING or OUTPUT does not jump to %s", p.Family, iptTop)
		case p.MarkBit >= 0 && (!st.chains[iptMarkChain(p.MarkBit)] || len(st.jumpsTo("POSTROUTING", iptMasq)) == 0):
			return cnierr.CheckFailed("IPv%d: the masquerade chains for mark bit %d are missing", p.Family, p.MarkBit)
		}
		if got, want := iptSigs(st.rules[ch]), planSigs(p); !slices.Equal(got, want) {
			return cnierr.CheckFailed("IPv%d: port mappings in %s are %v, want %v", p.Family, ch, got, want)
		}
	}
	return nil
}

func (d *iptDriver) gc(ctx context.Context, network string, valid map[string]bool) error {
	for _, f := range []firewall.Family{firewall.V4, firewall.V6} {
		st, err := d.read(ctx, f)
		if err != nil {
			return err
		}
		stale := gcStale(st.attachments(), st.tag, network, valid)
		if len(stale) == 0 && (len(st.attachments()) > 0 || !st.hasBase()) {
			continue
		}
		slog.Info("gc", "family", int(f), "stale", stale)
		if err := d.remove(ctx, f, stale); err != nil {
			return err
		}
	}
	return nil
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

// ---- nftables ----

type nftDriver struct{ auto bool }

const nftHint = baseHint("nftables")

func (d *nftDriver) apply(ctx context.Context, script string) error {
	slog.Debug("nft -f", "script", script)
	return firewall.NftApply(ctx, script)
}

// listEach reads the table (or, with chains, just those chains, one nft
// run each). A missing table or chain reads as empty.
func (d *nftDriver) listEach(ctx context.Context, chains []string) (*nftState, error) {
	var all strings.Builder
	if len(chains) == 0 {
		out, err := firewall.Nft(ctx, "-a", "list", "table", "inet", nftTable)
		if err != nil {
			if missing(err) {
				return parseNFTList(""), nil
			}
			return nil, cnierr.Wrap(err, "list nftables table %s", nftFQ)
		}
		return parseNFTList(out), nil
	}
	for _, c := range chains {
		out, err := firewall.Nft(ctx, "-a", "list", "chain", "inet", nftTable, c)
		if err != nil {
			if missing(err) {
				continue
			}
			return nil, cnierr.Wrap(err, "list nftables chain %s %s", nftFQ, c)
		}
		all.WriteString(out)
		all.WriteString("\n")
	}
	return parseNFTList(all.String()), nil
}

func missing(err error) bool {
	return err != nil && strings.Contains(err.Error(), "No such file or directory")
}

func (d *nftDriver) add(ctx context.Context, a attachment.ID, plans []famPlan) error {
	if len(plans) == 0 {
		return nil
	}
	err := firstTry(nftHint, renderNFTAddNew(a, plans), renderNFTAddFresh(a, plans), func(script string) error {
		return d.apply(ctx, script)
	})
	if err == nil || isTryAgain(err) {
		return err
	}
	slog.Debug("single-transaction ADD refused; reading the table", "error", err)
	return locked(func() error {
		st, err := d.listEach(ctx, nil)
		if err != nil {
			return err
		}
		if err := d.apply(ctx, renderNFTEnsure(st, a, plans)); err != nil {
			return cnierr.Wrap(err, "install the port mappings (nftables)")
		}
		nftHint.set(true)
		if d.auto {
			writeBackendCache(firewall.Backend{Kind: firewall.NFTables})
		}
		return nil
	})
}

func (d *nftDriver) del(ctx context.Context, key string, _ []firewall.Family, wantUDP bool) (map[firewall.Family][]int, error) {
	ch := nftAttChain(key)
	chains := []string{nftHostports}
	if wantUDP {
		chains = append(chains, ch)
	}
	st, err := d.listEach(ctx, chains)
	if err != nil {
		return nil, err
	}
	udp := nftUDPPorts(st.chains[ch])
	hp := st.chains[nftHostports]
	mine := len(st.jumps(nftHostports, ch))
	if hp == nil || mine == 0 {
		return udp, nil // no table, or this attachment is not in it (already deleted)
	}
	// The jump exists, so the chain does (the kernel refuses jumps to
	// missing chains).
	if st.chains[ch] == nil {
		st.chains[ch] = &nftChain{}
	}
	st.exists = true
	teardown := len(hp.rules) == mine
	err = d.apply(ctx, renderNFTRemove(st, []string{key}, teardown))
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
	// the lock from a full listing.
	return udp, d.remove(ctx, []string{key})
}

// tryTeardown deletes the table if no attachment chain is left: one
// transaction that the kernel refuses while any refers to the anchor.
func (d *nftDriver) tryTeardown(ctx context.Context) {
	_ = locked(func() error {
		if err := d.apply(ctx, nftScript(nftTeardownLines())); err != nil {
			slog.Debug("table kept", "reason", err)
			return nil
		}
		d.forget()
		return nil
	})
}

// forget drops the hint and the remembered detection once the table is
// gone.
func (d *nftDriver) forget() {
	nftHint.set(false)
	if d.auto {
		removeBackendCache()
	}
}

func (d *nftDriver) remove(ctx context.Context, keys []string) error {
	return locked(func() error {
		var err error
		for _, teardown := range []bool{true, false} {
			var st *nftState
			if st, err = d.listEach(ctx, nil); err != nil {
				return err
			}
			var present []string
			for _, k := range keys {
				if st.chains[nftAttChain(k)] != nil || len(st.jumps(nftHostports, nftAttChain(k))) > 0 {
					present = append(present, k)
				}
			}
			teardown = teardown && remaining(st.attachments(), present) == 0
			script := renderNFTRemove(st, present, teardown)
			if script == "" {
				return nil
			}
			if err = d.apply(ctx, script); err == nil {
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
	st, err := d.listEach(ctx, nil)
	if err != nil {
		return err
	}
	ch := nftAttChain(a.PortmapKey())
	c := st.chains[ch]
	switch {
	case len(plans) == 0:
		return nil
	case c == nil:
		return cnierr.CheckFailed("nftables chain %s of this attachment is missing", ch)
	case len(st.jumps(nftHostports, ch)) != 1:
		return cnierr.CheckFailed("nftables chain %s has %d jumps to %s, want 1", nftHostports, len(st.jumps(nftHostports, ch)), ch)
	case len(st.jumps("prerouting", nftHostports)) == 0 || len(st.jumps("output", nftHostports)) == 0:
		return cnierr.CheckFailed("nftables prerouting or output does not jump to %s", nftHostports)
	}
	var want []string
	for _, p := range plans {
		want = append(want, planSigs(p)...)
	}
	sort.Strings(want)
	if got := nftSigs(c); !slices.Equal(got, want) {
		return cnierr.CheckFailed("port mappings in nftables chain %s are %v, want %v", ch, got, want)
	}
	return nil
}

func (d *nftDriver) gc(ctx context.Context, network string, valid map[string]bool) error {
	st, err := d.listEach(ctx, nil)
	if err != nil || !st.exists {
		return err
	}
	tagOf := func(k string) string {
		if c := st.chains[nftAttChain(k)]; c != nil {
			return c.comment
		}
		return ""
	}
	stale := gcStale(st.attachments(), tagOf, network, valid)
	if len(stale) == 0 && len(st.attachments()) > 0 {
		return nil
	}
	slog.Info("gc", "stale", stale)
	return d.remove(ctx, stale)
}
