package firewall

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// What a feature owns (ruleset.Owned), replaced and removed whole the way
// its backend allows: a native nftables table in the same transaction as
// its new content, iptables chains by their jumps first, then
// themselves.

// Replace writes tx in place of what o names: with native nftables in
// one transaction (o's tables destroyed first, unless tx does so
// itself); with iptables, o's chains and the jumps to them removed first
// (Remove's), then tx. The ipsets stay: tx declares what it needs of
// them, and a rule that still uses one keeps it from going.
func Replace(ctx context.Context, fw Interface, o ruleset.Owned, tx *ruleset.Tx) error {
	if err := tx.Err(); err != nil {
		return err
	}
	if err := removeChains(ctx, fw, o.Chains); err != nil {
		return err
	}
	all := &ruleset.Tx{}
	for _, id := range o.Tables {
		if !destroysFirst(tx, id) {
			all.DestroyTable(id)
		}
	}
	all.Append(tx)
	return fw.Apply(ctx, all)
}

// destroysFirst tells whether tx removes table id before anything else
// it does in it.
func destroysFirst(tx *ruleset.Tx, id ruleset.TableID) bool {
	for _, op := range tx.Ops() {
		if op.Table == id {
			return op.Object() == "table" && (op.Verb == ruleset.Destroy || op.Verb == ruleset.Replace)
		}
	}
	return false
}

// Remove removes what o names, none of it there being no error: its
// tables, its chains with the jumps to them, then its ipsets.
func Remove(ctx context.Context, fw Interface, o ruleset.Owned) error {
	tx := &ruleset.Tx{}
	for _, id := range o.Tables {
		tx.DestroyTable(id)
	}
	if err := fw.Apply(ctx, tx); err != nil {
		return err
	}
	if err := removeChains(ctx, fw, o.Chains); err != nil {
		return err
	}
	sets := &ruleset.Tx{}
	for _, s := range o.IPSets {
		sets.DestroySet(ruleset.IPSets(s.Family), s)
	}
	return fw.Apply(ctx, sets)
}

// removeChains removes, from each table, the jumps from its built-in
// chains to the chains, then the chains; a table or chain that is not
// there is left alone.
func removeChains(ctx context.Context, fw Interface, owned []ruleset.OwnedChains) error {
	var errs []error
	for _, oc := range owned {
		id := oc.Table
		if ok, err := fw.HasTable(ctx, id.Family, id.Name); err != nil || !ok {
			errs = append(errs, err)
			continue
		}
		for _, b := range oc.Builtins {
			if _, err := DeleteMatching(ctx, fw, id.Family, id.Name, b, func(r installed.Rule) bool {
				return slices.Contains(oc.Chains, r.Jump)
			}); err != nil {
				errs = append(errs, fmt.Errorf("remove the jumps of %s %s: %w", id, b, err))
			}
		}
		tx := &ruleset.Tx{}
		for _, c := range oc.Chains {
			ok, err := fw.HasChain(ctx, id.Family, id.Name, c)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if ok {
				tx.FlushChain(id, c).DeleteChain(id, c)
			}
		}
		if err := fw.Apply(ctx, tx); err != nil {
			errs = append(errs, fmt.Errorf("remove the chains of %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}
