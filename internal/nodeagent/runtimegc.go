package nodeagent

import (
	"context"
	"log/slog"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/meshwire/meshwire/internal/crigc"
)

// RuntimeGC is the agent's CNI GC of the node's network against the pod
// sandboxes the runtime lists over CRI (package crigc), for a runtime
// that does not call GC itself (containerd 2.4).
type RuntimeGC struct {
	// Options are crigc's; the agent sets Networks (the first config of
	// the installer's conf dir, read again each round), CNIPath (the
	// installer's bin dir) and NodeState (the agent's).
	Options crigc.Options
	// Every is how often (default 5 minutes).
	Every time.Duration
}

// startRuntimeGC starts a round of the runtime GC in the background when
// one is due and none is running.
func (a *Agent) startRuntimeGC() {
	g := a.o.RuntimeGC
	if g == nil || a.repairCtx == nil || time.Since(a.lastGC) < g.Every || !a.collecting.CompareAndSwap(false, true) {
		return
	}
	a.lastGC = time.Now()
	a.repairs.Add(1)
	go func() {
		defer a.repairs.Done()
		defer a.collecting.Store(false)
		guard("the runtime GC", func() { a.runtimeGC(a.repairCtx, *g) })
	}()
}

// runtimeGC is one round: its outcome logged.
func (a *Agent) runtimeGC(ctx context.Context, g RuntimeGC) {
	o := g.Options
	l, path, err := crigc.Network(a.o.Install.ConfDir, "")
	if err != nil {
		slog.Warn("runtime GC: no network config to GC", "dir", a.o.Install.ConfDir, "error", err)
		return
	}
	o.Networks = []*libcni.NetworkConfigList{l}
	o.CNIPath = []string{a.o.Install.BinDir}
	o.NodeState = a.layout
	r, err := crigc.Run(ctx, o)
	if r != nil {
		for _, n := range r.Networks {
			attrs := []any{"config", path, "network", n.Network, "sandboxes", len(r.Sandboxes), "valid", len(n.Valid), "keptForAge", len(n.Young), "deleted", len(n.Deleted), "pluginGC", n.PluginGC}
			for _, d := range n.Deleted {
				attrs = append(attrs, "deletedAttachment", d.ContainerID+"/"+d.IfName)
			}
			if len(n.Deleted) > 0 {
				slog.Info("runtime GC", attrs...)
			} else {
				slog.Debug("runtime GC", attrs...)
			}
		}
	}
	if err != nil && ctx.Err() == nil {
		slog.Warn("runtime GC", "error", err)
	}
}
