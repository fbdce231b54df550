package nodeagent

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podstate"
)

// interceptPlugin is the chained plugin whose calls the agent repeats.
const interceptPlugin = "intercept"

// repairTimeout bounds one CHECK or ADD the agent runs for one pod.
const repairTimeout = 30 * time.Second

// pluginExec is the part of libcni's invoke.RawExec the agent uses.
type pluginExec interface {
	ExecPlugin(ctx context.Context, pluginPath string, stdinData []byte, environ []string) ([]byte, error)
}

// Repairer checks every meshed pod (the records with a call, package
// podstate) and repairs drift: it runs the intercept plugin's CHECK with
// the pod's recorded call and, when
// CHECK finds the pod's interception missing or changed (rules flushed in
// the pod, lost while the agent was down, an EBPF registration gone), the
// same ADD again, which converges on the pod's config. The plugin decides
// everything, the backend in the pod included, exactly as at the pod's
// start: the agent holds no state that could change what it picks.
type Repairer struct {
	// BinDir holds the intercept plugin (the host's CNI bin directory).
	BinDir string
	// Store holds the pods' records.
	Store podstate.Store

	// exec runs the plugin (invoke.RawExec when nil; tests replace it).
	exec pluginExec

	mu                sync.Mutex
	pods              int    // calls kept, at the last round
	rounds            uint64 // rounds that went through every pod
	repairs, failures uint64 // ADDs repeated that succeeded, failed
	checkFailures     uint64 // CHECKs that failed otherwise than on drift
	lastFailure       map[string]string
}

// RepairStats is what the metrics show of the repairs.
type RepairStats struct {
	Pods                      int
	Rounds                    uint64
	Repairs, Failures, Errors uint64
}

// Stats returns the counters.
func (r *Repairer) Stats() RepairStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return RepairStats{Pods: r.pods, Rounds: r.rounds, Repairs: r.repairs, Failures: r.failures, Errors: r.checkFailures}
}

// Round checks every meshed pod once and repairs the drifted ones. A pod
// whose namespace path is not there or leads to another namespace than at
// its ADD (gone, its DEL on its way; a name or pid reused) is left to its
// DEL, and so is one whose path leads to the agent's own namespace.
func (r *Repairer) Round(ctx context.Context) error {
	recs, err := r.Store.List()
	if err != nil {
		return err
	}
	calls := map[string]podstate.Record{}
	for name, rec := range recs {
		if rec.Call != nil {
			calls[name] = rec
		}
	}
	r.mu.Lock()
	r.pods = len(calls)
	if r.lastFailure == nil {
		r.lastFailure = map[string]string{}
	}
	r.mu.Unlock()
	seen := map[string]bool{}
	for name, c := range calls {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		seen[name] = true
		if c.Check() != nil {
			continue // gone, or the path leads elsewhere: left to its DEL
		}
		r.one(ctx, name, c)
	}
	r.mu.Lock()
	for name := range r.lastFailure {
		if !seen[name] {
			delete(r.lastFailure, name)
		}
	}
	r.rounds++
	r.mu.Unlock()
	return nil
}

// one checks one pod and repairs it when CHECK reports drift.
func (r *Repairer) one(ctx context.Context, name string, c podstate.Record) {
	err := r.run(ctx, "CHECK", c)
	if err == nil {
		r.note(name, "")
		return
	}
	var ce *types.Error
	if !errors.As(err, &ce) || ce.Code != cnierr.CodeInternal || !strings.HasPrefix(ce.Msg, "check failed") {
		// Not drift (a config this plugin build refuses, a version
		// without CHECK, a plugin that cannot run): nothing to repeat.
		r.mu.Lock()
		r.checkFailures++
		r.mu.Unlock()
		r.note(name, "cannot check the interception of pod "+c.ContainerID+": "+err.Error())
		return
	}
	drift := ce.Msg
	if err := r.run(ctx, "ADD", c); err != nil {
		r.mu.Lock()
		r.failures++
		r.mu.Unlock()
		r.note(name, "could not repair the interception of pod "+c.ContainerID+" ("+drift+"): "+err.Error())
		return
	}
	if !r.Store.Exists(name) {
		// The pod's DEL took its record between CHECK and the ADD: the
		// plugin's repair found it done and did nothing.
		slog.Info("the pod's DEL came before its repair; nothing repaired", "pod", c.Key(), "containerID", c.ContainerID, "drift", drift)
		return
	}
	r.mu.Lock()
	r.repairs++
	r.mu.Unlock()
	slog.Info("repaired the pod's interception", "pod", c.Key(), "containerID", c.ContainerID, "netns", c.Netns, "drift", drift)
	r.note(name, "")
}

// note logs a failure once per pod until it changes or the pod is well.
func (r *Repairer) note(name, failure string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if failure == "" {
		delete(r.lastFailure, name)
		return
	}
	if r.lastFailure[name] != failure {
		slog.Warn(failure, "record", name)
	}
	r.lastFailure[name] = failure
}

// run executes the plugin as the runtime did, cmd with the pod's call;
// an ADD says it is a repair (nodelayout.EnvRepair). The plugin finds
// the records where the agent reads them (nodelayout.EnvNodeStateDir).
func (r *Repairer) run(ctx context.Context, cmd string, c podstate.Record) error {
	ctx, cancel := context.WithTimeout(ctx, repairTimeout)
	defer cancel()
	args := invoke.Args{Command: cmd, ContainerID: c.ContainerID, NetNS: c.Netns, PluginArgsStr: c.Call.Args, IfName: c.IfName, Path: r.BinDir}
	env := append(args.AsEnv(), nodelayout.EnvNodeStateDir+"="+r.Store.Layout.Root)
	if cmd == "ADD" {
		env = append(env, nodelayout.EnvRepair+"=1")
	}
	var ex pluginExec = &invoke.RawExec{Stderr: os.Stderr}
	if r.exec != nil {
		ex = r.exec
	}
	_, err := ex.ExecPlugin(ctx, filepath.Join(r.BinDir, interceptPlugin), c.Call.Config, env)
	return err
}
