// Package bpfnode attaches meshwire's BPF programs on the node, the one
// sequence `meshwire fastpath attach` and the node agent (and `meshwire
// install --fastpath`) run. It attaches the fast path (package fastpath)
// and the ebpf interception programs (package capture). Callers replay
// the meshed pods' records into a fast path it attached (Result.Fresh;
// package podstate) and report what it did; it prints nothing.
package bpfnode

import (
	"github.com/meshwire/meshwire/ebpf/capture"
	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/ebpf/loader"
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
	// Fresh: a fast path was attached or replaced (not found attached):
	// it holds no pod's policy yet, and the caller replays the pods'
	// records into it.
	Fresh bool
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

// attachFastpath attaches the fast path and says whether it attached one
// (or replaced another build's).
func (r *Result) attachFastpath(cfg fastpath.Config) error {
	r.FastpathRan = true
	res, err := fastpath.Attach(cfg)
	r.Fastpath = res
	r.Fresh = err == nil && res != loader.AlreadyAttached
	return err
}
