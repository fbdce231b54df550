package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/meshwire/meshwire/internal/agentsocket"
	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/podstate"
)

// Istio's ambient mode (docs/ambient.md). The plugin records each
// Kubernetes pod (its namespace, names, addresses and Istio annotations:
// package podstate) and, when the node agent runs ambient mode, asks it
// to enroll the pod before the ADD returns: the pod's containers then
// never start before its traffic goes to ztunnel. Whether a pod is
// enrolled is the agent's to decide (its labels and its namespace's come
// from the API server).

// annDataplaneMode enrolls a pod in ambient mode when the agent has no
// API server to read the label of that name from.
const annDataplaneMode = ambient.LabelDataplaneMode

// ambientOn tells whether the agent's ambient mode is on: its socket is
// there (the agent leaves it when it stops, and removes it when it runs
// without ambient mode).
func ambientOn(store podstate.Store) bool {
	_, err := os.Stat(store.Layout.AgentSocket())
	return err == nil
}

// ambientAdd asks the agent to act on the pod, whose record is written.
// The agent's error fails the ADD (the runtime tries again): an enrolled
// pod must not start unredirected. No agent answering fails only a pod
// its own annotation enrolls: an agent that is restarting enrolls the
// others from their records when it is back.
func ambientAdd(store podstate.Store, rec podstate.Record, p pod) error {
	ctx, cancel := context.WithTimeout(context.Background(), agentsocket.AskTimeout)
	defer cancel()
	answer, err := agentsocket.Ask(ctx, store.Layout.AgentSocket(), rec.File())
	switch {
	case errors.Is(err, agentsocket.ErrNoAgent) && p.Annotations[annDataplaneMode] == "ambient":
		// Enrolled by its own annotation: it must not start before its
		// traffic goes to ztunnel.
		_ = store.Remove(rec.File())
		return cnierr.TryAgain("ambient mode: the pod's %s annotation enrolls it, and %v", annDataplaneMode, err)
	case errors.Is(err, agentsocket.ErrNoAgent):
		slog.Warn("the node agent does not answer; it enrolls the pod in ambient mode from its record when it is back", "error", err)
		return nil
	case err != nil:
		_ = store.Remove(rec.File())
		return cnierr.TryAgain("ambient mode: %v", err)
	}
	slog.Info("ambient mode", "answer", answer)
	return nil
}

// ambientDel tells the agent, once the pod's record is gone, which
// forgets the pod (ztunnel's workload, the probe sets' addresses). The
// agent's answer is not waited for long: DEL always finishes, and the
// agent forgets pods whose record is gone at its next round.
func ambientDel(store podstate.Store, args *skel.CmdArgs) {
	if !ambientOn(store) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), delAskTimeout)
	defer cancel()
	if _, err := agentsocket.Ask(ctx, store.Layout.AgentSocket(), podstate.Name(args.ContainerID, args.IfName)); err != nil {
		slog.Info("the node agent forgets the pod at its next round", "error", err)
	}
}

const delAskTimeout = 2 * time.Second
