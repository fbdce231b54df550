// Package bpfnode attaches meshwire's BPF programs on the node, the one
// sequence `meshwire fastpath attach` and the node agent (and `meshwire
// install --fastpath`) run. It attaches the fast path (package fastpath), the meshed
// pods' records replayed into a fast path just attached (podrecord), and
// the ebpf interception programs (package capture). Callers report what
// it did; it prints nothing.
package bpfnode

import (
	"github.com/meshwire/meshwire/ebpf/capture"
	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/ebpf/fastpath/podrecord"
	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/netns"
)

// Options say what to attach, and in which order.
type Options struct {
	Fastpath fastpath.Config
	// CaptureFirst attaches the ebpf interception programs before the
	// fast path, and stops when they fail: nothing is attached then (the
	// node agent, whose start changes nothing when it fails). Without
	// it the fast path goes first and stays attached when the ebpf
	// interception programs fail (`meshwire fastpath attach`).
	CaptureFirst bool
	// SkipFastpath, SkipCapture: the caller knows that step is done
	// (the programs it attached are still attached).
	SkipFastpath, SkipCapture bool
}

// Step names one step of Attach.
type Step int

const (
	StepFastpath Step = iota + 1
	StepCapture
)

// Result is what Attach did.
type Result struct {
	// Fastpath is what the fast path's attach did, when it ran
	// (FastpathRan).
	Fastpath    loader.Result
	FastpathRan bool
	// Replayed: the records were replayed (a fast path was attached or
	// replaced, not found attached), with what it did and its error,
	// which is reported, never fatal.
	Replayed  bool
	Replay    podrecord.Replayed
	ReplayErr error
	// Capture is what the ebpf interception programs' attach did, when
	// it ran (CaptureRan).
	Capture    loader.Result
	CaptureRan bool
	// Failed is the step that failed (0: none); Attach's error is its.
	Failed Step
}

// Attach runs the steps o asks for, in o's order, and stops at the first
// that fails.
func Attach(o Options) (Result, error) {
	var r Result
	steps := []Step{StepFastpath, StepCapture}
	if o.CaptureFirst {
		steps = []Step{StepCapture, StepFastpath}
	}
	for _, s := range steps {
		var err error
		switch {
		case s == StepFastpath && !o.SkipFastpath:
			err = r.attachFastpath(o.Fastpath)
		case s == StepCapture && !o.SkipCapture:
			r.CaptureRan = true
			r.Capture, err = capture.Attach(o.Fastpath.Cgroup, "")
		}
		if err != nil {
			r.Failed = s
			return r, err
		}
	}
	return r, nil
}

// attachFastpath attaches the fast path and, when it attached one (or
// replaced another build's), writes the meshed pods' fast-path records
// into it: their policies survive a detach (the agent's restart) and
// reach pods created while it was not attached.
func (r *Result) attachFastpath(cfg fastpath.Config) error {
	r.FastpathRan = true
	res, err := fastpath.Attach(cfg)
	r.Fastpath = res
	if err != nil || res == loader.AlreadyAttached {
		return err
	}
	r.Replayed = true
	r.Replay, r.ReplayErr = podrecord.Replay("", cfg.PinDir, netns.Live)
	return nil
}
