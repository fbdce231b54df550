package nodeagent

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/meshwire/meshwire/ebpf/bpfnode"
	"github.com/meshwire/meshwire/ebpf/capture"
	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/podstate"
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
	// Store holds the pods' records, replayed into a fast path this
	// owner attaches.
	Store podstate.Store

	owned    bool
	attaches uint64 // attachments this owner made
	lastErr  error
	// captured: this owner attached (or found, same build) the ebpf
	// interception programs; from then on they are only attached again
	// when they go.
	captured bool
	// The sweeps of the pinned entries kept per pod: ebpf interception's
	// registrations and the fast path's pod policies.
	captureGC, policyGC, rulesGC nsSweep[uint64]
}

// nsSweep collects the entries of one store (a map keyed by namespace
// cookie, the pods' records by name) whose namespace is gone without a
// DEL.
type nsSweep[K comparable] struct {
	// suspects are the entries the last sweep found without a namespace
	// (key -> nsfs inode).
	suspects  map[K]uint64
	collected uint64
}

// sweep forgets the entries that stale reports now and reported the last
// time too, with the same inode: a namespace that moved between holders
// (a task, an open file, a bind mount) while one sweep walked /proc is
// seen by the next. forget removes one entry if it still has that inode.
func (s *nsSweep[K]) sweep(stale map[K]uint64, forget func(key K, ino uint64) error, log func(key K, ino uint64)) error {
	for key, ino := range stale {
		if prev, ok := s.suspects[key]; !ok || prev != ino {
			continue
		}
		if err := forget(key, ino); err != nil {
			return err
		}
		delete(stale, key)
		s.collected++
		log(key, ino)
	}
	s.suspects = stale
	return nil
}

// Collect forgets the ebpf interception registrations, the fast-path
// policies and the fast path's copies of interception settings of pods
// whose network namespace is gone without a DEL (a crashed runtime, a node
// restored from a snapshot of its pins): an entry goes when two sweeps in
// a row found its namespace gone. Outside the host's PID namespace it does
// nothing and says why (netns.ErrPartialView): there, live pods would look
// gone.
func (f *FastpathOwner) Collect() error {
	dir, rules := f.Config.PinDir, loader.RulesDir(f.Config.PinDir)
	for _, c := range []struct {
		what   string
		sweep  *nsSweep[uint64]
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
	} {
		stale, err := c.stale()
		if errors.Is(err, pods.ErrNotAttached) {
			c.sweep.suspects = nil
			continue
		}
		if err == nil {
			err = c.sweep.sweep(stale, c.forget, func(ns, ino uint64) {
				slog.Info("collected the "+c.what+" of a pod whose namespace is gone without a DEL", "netnsCookie", ns, "netnsIno", ino)
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
		slog.Info("replaced the ebpf interception programs of another meshwire build in place", "pins", capture.DefaultPinDir)
	case r.Capture == loader.Attached:
		slog.Info("attached the ebpf interception programs", "pins", capture.DefaultPinDir)
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
		slog.Info("fast path already attached; it is this agent's now, detached when it stops", "pins", f.Config.PinDir)
	case already && !f.owned:
		if f.lastErr != nil || f.attaches == 0 {
			slog.Info("fast path already attached; leaving it attached on exit", "pins", f.Config.PinDir)
		}
	case already:
	default:
		switch {
		case r.Fastpath == loader.Replaced:
			slog.Info("replaced the fast path of another meshwire build with this one's; its connections keep the old one until they close", "pins", f.Config.PinDir)
		case f.owned:
			slog.Warn("the fast path was detached by someone else; attached it again", "pins", f.Config.PinDir)
		default:
			slog.Info("attached the fast path", "pins", f.Config.PinDir)
		}
		f.owned = true
		f.attaches++
		// The meshed pods' records (package podstate), written into the
		// fast path just attached: their policies survive this agent's
		// restart (which detaches) and reach pods created while it was
		// not attached.
		m, rp, err := f.Store.Restore(f.Config.PinDir, netns.Live)
		if m.Any() {
			slog.Info("moved an earlier version's records of the pods", "dir", f.Store.Dir(), "calls", m.Calls, "fastpathPolicies", m.Fastpath, "enrolled", m.Enrolled)
		}
		if rp.Pods > 0 || rp.Dropped > 0 {
			slog.Info(fmt.Sprintf("restored the fast-path policies of %d meshed pods", rp.Pods), "dir", f.Store.Dir(), "goneRemoved", rp.Dropped)
		}
		if err != nil {
			slog.Warn("could not restore every meshed pod's fast-path policy", "error", err)
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
		slog.Warn("ebpf interception left attached", "error", err)
	case was:
		slog.Info("detached the ebpf interception programs")
	}
	d, err := fastpath.Detach(f.Config.PinDir)
	switch {
	case err != nil:
		return fmt.Errorf("detach the fast path: %w", err)
	case !d.WasAttached:
		slog.Info("fast path was no longer attached")
	case d.Live > 0:
		slog.Info(fmt.Sprintf("detached the fast path; %d sockets keep it until they close", d.Live))
	default:
		slog.Info("detached the fast path")
	}
	return nil
}

// sweep collects what pods gone without a DEL left: the pods' records
// and, with the fast path, its pinned entries (FastpathOwner.Collect).
func (a *Agent) sweep() error {
	var errs []error
	if a.fp != nil {
		errs = append(errs, a.fp.Collect())
		a.mu.Lock()
		a.collected, a.collectedPolicies = a.fp.Collected()
		a.mu.Unlock()
	}
	stale, err := a.store.Stale(netns.Live)
	if err == nil {
		err = a.records.sweep(stale, a.store.Forget, func(name string, ino uint64) {
			slog.Info("collected the record of a pod whose namespace is gone without a DEL", "record", name, "netnsIno", ino)
		})
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("collect the pods' records of namespaces that are gone: %w", err))
	}
	return errors.Join(errs...)
}
