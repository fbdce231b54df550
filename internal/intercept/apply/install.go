package apply

import (
	"context"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/intercept/flags"
	"github.com/meshwire/meshwire/internal/killpoint"
)

// Outcome is what Install did, for its caller to report.
type Outcome struct {
	// Mode is the mode installed: the request's, or its Fallback where
	// the node could not capture the pod in EBPF mode.
	Mode intercept.Mode
	// FellBack is why EBPF mode was not installed, when Mode is the
	// fallback.
	FellBack error
	// Backend is the firewall the rules went into (none in EBPF mode).
	Backend firewall.Backend
	// UpToDate: the rules were already installed as asked.
	UpToDate bool
	// DryRun is what Install would do, with Request.DryRun.
	DryRun string
	// UndoErr is why undoing a failed install (Request.Undo) failed.
	UndoErr error
}

// RequestOf is the request of the options o in the namespace the calling
// thread is in: its addresses, and whether IPv6 rules are wanted there.
func RequestOf(o flags.Options) (Request, error) {
	addrs, err := LocalAddrs()
	if err != nil {
		return Request{}, err
	}
	return Request{Config: o.Config, IPv6: WantIPv6(o.DualStack, addrs), Backend: o.Backend,
		Reconcile: o.Reconcile, Force: o.ForceApply, Local: addrs, Fallback: o.EBPFFallback, DryRun: o.DryRun}, nil
}

// Install is the one way interception goes into a namespace, that of the
// calling thread: EBPF mode's registration (InstallEBPF), or, in another
// mode or in req.Fallback's where the node cannot capture the pod, the
// rules: the installed state read and the change planned (Prepare, whose
// plan is intercept.Plan's), then applied (Plan.Apply) and, with
// req.Undo, removed again when that fails. With req.DryRun it changes
// nothing and the Outcome says what it would do. The Outcome is filled
// as far as Install got, also when it fails.
func Install(ctx context.Context, req Request) (Outcome, error) {
	out := Outcome{Mode: req.Config.Mode}
	if out.Mode == intercept.ModeEBPF {
		if req.DryRun {
			out.DryRun = DescribeEBPF(req)
			return out, nil
		}
		err := InstallEBPF(ctx, req)
		if err == nil || req.Fallback == "" || !EBPFUnavailable(err) {
			return out, err
		}
		out.Mode, out.FellBack = req.Fallback, err
		req.Config.Mode = req.Fallback
	}
	// A repeated install converges on the config: same rules, nothing
	// done; other rules (with Reconcile), replaced without a gap.
	plan, err := Prepare(ctx, req)
	if plan != nil {
		out.Backend = plan.Backend
		if req.DryRun {
			out.DryRun = plan.String()
		}
	}
	if err != nil || req.DryRun {
		return out, err
	}
	out.UpToDate = plan.UpToDate()
	killpoint.Here("planned")
	// With the rules in place, Apply only makes sure the policy routing
	// is there too.
	if err := plan.Apply(ctx); err != nil {
		if req.Undo {
			_, out.UndoErr = Cleanup(ctx, req, false)
		}
		return out, err
	}
	return out, nil
}
