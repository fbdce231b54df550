package apply

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// Cleanup removes everything meshwire (or istio-iptables) installed for
// interception in every backend present, and the policy routing and
// passthrough address of req.Config's mark and table. It returns what it
// removed, as the plan it ran (or, with dryRun, would run). Of req, only
// Config, Firewall and Routing count.
func Cleanup(ctx context.Context, req Request, dryRun bool) (string, error) {
	var out strings.Builder
	routing := req.routing()
	// The policy routing to remove: that of the given flags, and that of
	// any TPROXY mark the installed rules use (installed with other -t/-r).
	steps := intercept.Routing(withMode(req.Config, intercept.ModeTProxy), true)
	var held []*holding
	for _, b := range allBackends {
		fw := req.open(b, false)
		if fw == nil {
			continue
		}
		defer release(fw)
		h := read(ctx, b, fw)
		for _, mark := range h.Marks() {
			steps = appendNew(steps, routing.OfMark(mark)...)
		}
		held = append(held, h)
	}
	for _, h := range held {
		script := h.script()
		if script == "" {
			continue
		}
		fmt.Fprintf(&out, "# %s\n%s", h.b, script)
		if !dryRun {
			if err := h.remove(ctx, h.Removal()); err != nil {
				return out.String(), err
			}
		}
	}
	for _, s := range steps {
		fmt.Fprintf(&out, "# remove if present: %s\n", s)
	}
	out.WriteString("# remove if present: the pod's ebpf interception registration and inbound filters\n")
	if !dryRun {
		if err := routing.Remove(steps); err != nil {
			return out.String(), err
		}
		if err := req.forgetEBPF(); err != nil {
			return out.String(), err
		}
	}
	return out.String(), nil
}

// script is the removal as text (dry runs), "" when there is nothing.
func (h *holding) script() string {
	var b strings.Builder
	for _, tx := range h.Removal() {
		b.WriteString(text(h.b, tx))
	}
	return b.String()
}

// remove applies removals (Held.Removal) of what h holds: one
// transaction per family (iptables) or one in all (nftables).
func (h *holding) remove(ctx context.Context, removal []*ruleset.Tx) error {
	for _, tx := range removal {
		if err := h.fw.Apply(ctx, tx); err != nil {
			return fmt.Errorf("remove meshwire's rules from %s: %w", h.b, err)
		}
	}
	return nil
}

func withMode(c intercept.Config, m intercept.Mode) intercept.Config {
	c.Mode = m
	return c
}

func appendNew(steps []intercept.Step, more ...intercept.Step) []intercept.Step {
	for _, s := range more {
		if !slices.Contains(steps, s) {
			steps = append(steps, s)
		}
	}
	return steps
}
