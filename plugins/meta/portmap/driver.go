package main

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/filelock"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// stateDir holds the node-wide lock of the slow paths and the hints that
// say which ADD transaction to try first.
var stateDir = nodelayout.PortmapDir

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

// driver programs one backend through the firewall front door: iptDriver
// (iptables.go) and nftDriver (nftables.go), each beside its layout.
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
