package apply

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/killpoint"
)

// EBPF mode (intercept.ModeEBPF): no rule in the namespace; the pod's
// settings go into the node's eBPF maps (package pods) and its interfaces
// run the inbound program. Everything here works in the namespace the
// calling thread is in.

// InstallEBPF registers the pod for EBPF mode with req.Config and
// req.Local. Interception rules of another mode found in the
// namespace are removed with req.Reconcile (or Force) and refused
// otherwise, as Prepare refuses other settings; nothing is changed then,
// nor when the node cannot capture the pod (EBPFUnavailable). A failure
// after the registration undoes it.
func InstallEBPF(ctx context.Context, req Request) error {
	s, err := SettingsOf(req.Config, req.Local, req.IPv6)
	if err != nil {
		return err
	}
	if err := pods.Ready("", s); err != nil {
		return err
	}
	present, err := rulesPresent(ctx, req)
	if err != nil {
		return err
	}
	if present {
		if !req.Reconcile && !req.Force {
			return fmt.Errorf("%w: rules of another interception mode are in the namespace (reconcile replaces them with EBPF mode)", ErrDifferent)
		}
		if _, err := Cleanup(ctx, req, false); err != nil {
			return fmt.Errorf("remove the rules of the previous mode: %w", err)
		}
	}
	// With IPv6, the proxy's passthrough source ::6 on lo, as in the
	// other modes.
	if err := req.routing().Apply(intercept.Routing(req.Config, req.IPv6)); err != nil {
		return err
	}
	if err := pods.Register("", s); err != nil {
		return err
	}
	killpoint.Here("registered")
	if req.Config.InboundPorts.Empty() {
		err = pods.DetachIngress()
	} else {
		err = pods.AttachIngress("", nil)
	}
	if err != nil {
		if ferr := forgetEBPF(); ferr != nil {
			err = errors.Join(err, ferr)
		}
	}
	return err
}

// EBPFUnavailable reports whether err, from InstallEBPF, says that this
// node cannot capture the pod in EBPF mode (the programs are not
// attached, or were attached by a build without a hook the pod needs),
// which --ebpf-fallback answers with another mode's rules.
//
// Where the pins cannot be seen (pods.ErrBPFFSHidden) it reports false:
// the programs may well be attached, and another mode's rules on top of
// them would capture the pod twice.
func EBPFUnavailable(err error) bool {
	if errors.Is(err, pods.ErrBPFFSHidden) {
		return false
	}
	return errors.Is(err, pods.ErrNotAttached) || errors.Is(err, pods.ErrNoDNSHooks)
}

// EBPFRegistered reports whether the pod whose namespace the thread is in
// is registered for EBPF mode (false too where nothing is attached).
func EBPFRegistered() bool {
	_, ok, err := pods.Registered("")
	return err == nil && ok
}

// CheckEBPF reports what differs from EBPF mode installed with
// req.Config: nil when the pod's registration and inbound filters are as
// InstallEBPF leaves them.
func CheckEBPF(req Request) error {
	s, err := SettingsOf(req.Config, req.Local, req.IPv6)
	if err != nil {
		return err
	}
	got, ok, err := pods.Registered("")
	got.NetnsIno = 0 // Register's bookkeeping, not a setting
	switch {
	case err != nil:
		return err
	case !ok:
		return errors.New("the pod is not registered for ebpf interception")
	case got != s.Capture:
		return registrationDiffers(got, s.Capture)
	}
	if steps, err := MissingSteps(intercept.Routing(req.Config, req.IPv6)); err != nil || len(steps) > 0 {
		if err == nil {
			err = fmt.Errorf("missing: %s", steps[0])
		}
		return err
	}
	if req.Config.InboundPorts.Empty() {
		return nil
	}
	missing, err := pods.IngressMissing(nil)
	if err == nil && len(missing) > 0 {
		err = fmt.Errorf("the inbound capture program is missing on %v", missing)
	}
	return err
}

// earlierBuildEBPF is CHECK's error for a pod registered by a build before
// pods.FlagIPv4Only (registrationDiffers).
const earlierBuildEBPF = "the pod's ebpf interception is an earlier build's: it captures the pod's IPv6, which the config leaves alone"

// registrationDiffers says how the pod's entry got differs from want,
// the entry InstallEBPF registers. A build before pods.FlagIPv4Only
// registered a pod whose IPv6 is not intercepted without the flag, and so
// captured (and reset) its inbound IPv6: CHECK names that case, and the
// agent's repair on an upgraded node rewrites the entry (a map update,
// which leaves the pod's connections alone), as the fix meant.
func registrationDiffers(got, want pods.Capture) error {
	earlier := want
	earlier.Flags &^= pods.FlagIPv4Only
	if want.Flags&pods.FlagIPv4Only != 0 && got == earlier {
		return errors.New(earlierBuildEBPF)
	}
	return errors.New("the pod's ebpf interception settings differ from the config's")
}

// DescribeEBPF is the dry-run text of InstallEBPF.
func DescribeEBPF(req Request) string {
	c := req.Config
	in := "no inbound capture"
	if !c.InboundPorts.Empty() {
		in = fmt.Sprintf("inbound SYNs to port %d (tc ingress on every interface but lo)", c.InboundCapturePort)
	}
	return fmt.Sprintf("# EBPF mode: no netfilter rule; register the pod in %s: outbound connections to port %d, %s\n", loader.CapturePinDir, c.ProxyPort, in)
}

// forgetEBPF removes the pod's registration, then its inbound filters
// (which, without a registration, let everything pass). It does so whether
// or not the pod's entry is there: a register or a forget killed half way
// leaves ports and ranges keyed by the namespace, and filters, without the
// entry (Register writes it last, Forget removes it first), which only a
// full prune finds. Pins this process may not open (an init container
// with NET_ADMIN but not CAP_BPF, say) hold nothing of its making.
func forgetEBPF() error {
	err := pods.Forget("")
	if errors.Is(err, os.ErrPermission) {
		return nil
	}
	return errors.Join(err, pods.DetachIngress())
}

// rulesPresent reports whether any backend holds interception rules of
// meshwire's (or istio-iptables') in the namespace.
func rulesPresent(ctx context.Context, req Request) (bool, error) {
	for _, b := range allBackends {
		fw := req.open(b, false)
		if fw == nil {
			continue
		}
		h := read(ctx, b, fw)
		release(fw)
		if len(h.Removal()) > 0 {
			return true, nil
		}
	}
	return false, nil
}
