package nodeagent

import (
	"errors"
	"fmt"

	"github.com/meshwire/meshwire/ebpf/bpfnode"
	"github.com/meshwire/meshwire/ebpf/capture"
	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/ebpf/fastpath/podrecord"
	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/netns"
)

// FastpathOwner attaches the eBPF fast path for a long-running command
// (`meshwire node`, `meshwire install --fastpath`), keeps it attached, and
// takes it back when the command stops.
type FastpathOwner struct {
	Config fastpath.Config
	// Adopt makes a fast path found attached with the same settings this
	// owner's to detach: the node agent's, after a restart of its
	// container. Without it such a fast path is someone else's (`meshwire
	// fastpath attach` by hand) and stays attached when the owner stops.
	Adopt bool
	Logf  func(format string, a ...any)

	owned    bool
	attaches uint64 // attachments this owner made
	lastErr  error
	// captured: this owner attached (or found, same build) the ebpf
	// interception programs; from then on they are only attached again
	// when they go.
	captured bool
	// The sweeps of the pinned entries kept per pod: ebpf interception's
	// registrations and the fast path's pod policies.
	captureGC, policyGC, rulesGC, recordGC nsSweep
}

// nsSweep collects the entries of one map keyed by namespace cookie whose
// namespace is gone without a DEL.
type nsSweep struct {
	// suspects are the entries the last sweep found without a namespace
	// (cookie -> nsfs inode).
	suspects  map[uint64]uint64
	collected uint64
}

// sweep forgets the entries that stale reports now and reported the last
// time too, with the same inode: a namespace that moved between holders
// (a task, an open file, a bind mount) while one sweep walked /proc is
// seen by the next. forget removes one entry if it still has that inode.
func (s *nsSweep) sweep(stale map[uint64]uint64, forget func(ns, ino uint64) error, logf func(ns, ino uint64)) error {
	for ns, ino := range stale {
		if prev, ok := s.suspects[ns]; !ok || prev != ino {
			continue
		}
		if err := forget(ns, ino); err != nil {
			return err
		}
		delete(stale, ns)
		s.collected++
		logf(ns, ino)
	}
	s.suspects = stale
	return nil
}

// Collect forgets the ebpf interception registrations, the fast-path
// policies, the fast path's copies of interception settings and the
// fast-path records (podrecord) of pods
// whose network namespace is gone without a DEL (a crashed runtime, a node
// restored from a snapshot of its pins): an entry goes when two sweeps in
// a row found its namespace gone. Outside the host's PID namespace it does
// nothing and says why (netns.ErrPartialView): there, live pods would look
// gone.
func (f *FastpathOwner) Collect() error {
	dir, rules := f.Config.PinDir, loader.RulesDir(f.Config.PinDir)
	for _, c := range []struct {
		what   string
		sweep  *nsSweep
		stale  func() (map[uint64]uint64, error)
		forget func(ns, ino uint64) error
	}{
		{"ebpf interception registration", &f.captureGC,
			func() (map[uint64]uint64, error) { return pods.Stale("", netns.Live) },
			func(ns, ino uint64) error { return pods.ForgetStale("", ns, ino) }},
		{"fast-path policy", &f.policyGC,
			func() (map[uint64]uint64, error) { return podpolicy.Stale(dir, netns.Live) },
			func(ns, ino uint64) error { return podpolicy.ForgetStale(dir, ns, ino) }},
		{"fast path's copy of the interception settings", &f.rulesGC,
			func() (map[uint64]uint64, error) { return pods.Stale(rules, netns.Live) },
			func(ns, ino uint64) error { return pods.ForgetStale(rules, ns, ino) }},
		{"fast-path record", &f.recordGC,
			func() (map[uint64]uint64, error) { return podrecord.Stale("", netns.Live) },
			func(ns, ino uint64) error { return podrecord.ForgetStale("", ns, ino) }},
	} {
		stale, err := c.stale()
		if errors.Is(err, pods.ErrNotAttached) {
			c.sweep.suspects = nil
			continue
		}
		if err == nil {
			err = c.sweep.sweep(stale, c.forget, func(ns, ino uint64) {
				f.Logf("forgot the %s of a pod whose namespace is gone without a DEL (netns cookie %d, nsfs inode %d)", c.what, ns, ino)
			})
		}
		if err != nil {
			return fmt.Errorf("collect the %s of namespaces that are gone: %w", c.what, err)
		}
	}
	return nil
}

// Collected counts the registrations and the policies Collect forgot.
func (f *FastpathOwner) Collected() (registrations, policies uint64) {
	return f.captureGC.collected, f.policyGC.collected
}

// Ensure attaches the ebpf interception programs and the fast path
// unless they are attached (bpfnode.Attach, interception first: when it
// fails nothing is attached). It returns nil when both are attached
// afterwards; the caller reports the error.
func (f *FastpathOwner) Ensure() error {
	r, err := bpfnode.Attach(bpfnode.Options{
		Fastpath:     f.Config,
		CaptureFirst: true,
		SkipCapture:  f.captured && capture.IsAttached(""),
		SkipFastpath: f.owned && f.lastErr == nil && fastpath.IsAttached(f.Config.PinDir),
	})
	if r.CaptureRan {
		f.captured = r.Failed != bpfnode.StepCapture
	}
	switch {
	case r.Failed == bpfnode.StepCapture:
		return fmt.Errorf("attach the ebpf interception programs: %w", err)
	case !r.CaptureRan:
	case r.Capture == loader.Replaced:
		f.Logf("replaced the ebpf interception programs of another meshwire build in place (%s)", capture.DefaultPinDir)
	case r.Capture == loader.Attached:
		f.Logf("attached the ebpf interception programs (pinned in %s)", capture.DefaultPinDir)
	}
	if !r.FastpathRan {
		return nil
	}
	already := err == nil && r.Fastpath == loader.AlreadyAttached
	switch {
	case err != nil:
		err = fmt.Errorf("attach the fast path: %w", err)
	case already && !f.owned && f.Adopt:
		f.owned = true
		f.Logf("fast path already attached (%s); it is this agent's now, detached when it stops", f.Config.PinDir)
	case already && !f.owned:
		if f.lastErr != nil || f.attaches == 0 {
			f.Logf("fast path already attached (%s); leaving it attached on exit", f.Config.PinDir)
		}
	case already:
	default:
		switch {
		case r.Fastpath == loader.Replaced:
			f.Logf("replaced the fast path of another meshwire build with this one's (pinned in %s); its connections keep the old one until they close", f.Config.PinDir)
		case f.owned:
			f.Logf("the fast path was detached by someone else; attached it again (pinned in %s)", f.Config.PinDir)
		default:
			f.Logf("attached the fast path (pinned in %s)", f.Config.PinDir)
		}
		f.owned = true
		f.attaches++
		// The meshed pods' fast-path records (podrecord), written into
		// the fast path just attached: their policies survive this
		// agent's restart (which detaches) and reach pods created while
		// it was not attached.
		if r.Replay.Pods > 0 || r.Replay.Dropped > 0 {
			f.Logf("restored the fast-path policies of %d meshed pods from %s (%d records of namespaces gone removed)", r.Replay.Pods, podrecord.Dir, r.Replay.Dropped)
		}
		if r.ReplayErr != nil {
			f.Logf("restoring the meshed pods' fast-path policies: %v", r.ReplayErr)
		}
	}
	f.lastErr = err
	return err
}

// Attaches counts the attachments this owner made.
func (f *FastpathOwner) Attaches() uint64 { return f.attaches }

// Release detaches the fast path when it is this owner's. Sockets still on
// it keep it, and the bytes it queued for them, until they close: the
// kernel keeps the sockhash alive through them (see package fastpath).
func (f *FastpathOwner) Release() error {
	if !f.owned {
		return nil
	}
	f.owned = false
	// The interception programs stay while pods use them: their
	// connections would bypass their sidecars, and the next agent (an
	// upgrade) takes them over in place.
	switch was, err := capture.Detach("", false); {
	case err != nil:
		f.Logf("ebpf interception left attached: %v", err)
	case was:
		f.Logf("detached the ebpf interception programs")
	}
	d, err := fastpath.Detach(f.Config.PinDir)
	switch {
	case err != nil:
		return fmt.Errorf("detach the fast path: %w", err)
	case !d.WasAttached:
		f.Logf("fast path was no longer attached")
	case d.Live > 0:
		f.Logf("detached the fast path; %d sockets keep it until they close", d.Live)
	default:
		f.Logf("detached the fast path")
	}
	return nil
}
