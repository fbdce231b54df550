package main

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/podnetns"
)

// Istio's ambient mode (docs/ambient.md). The plugin records where each
// Kubernetes pod's namespace is (package podnetns) and, when the node
// agent runs ambient mode, asks it to enroll the pod before the ADD
// returns: the pod's containers then never start before its traffic goes
// to ztunnel. Whether a pod is enrolled is the agent's to decide (its
// labels and its namespace's come from the API server).

// podsDir and agentSocket are podnetns's, changed by tests.
var (
	podsDir     = os.Getenv("MESHWIRE_PODS_DIR")
	agentSocket = os.Getenv("MESHWIRE_AMBIENT_SOCKET")
)

// annDataplaneMode enrolls a pod in ambient mode when the agent has no
// API server to read the label of that name from.
const annDataplaneMode = ambient.LabelDataplaneMode

// ambientAdd records the pod and asks the agent, when the agent's ambient
// mode is on (its socket is there: the agent leaves it when it stops).
// The agent's error fails the ADD (the runtime tries again): an enrolled
// pod must not start unredirected. No agent answering fails only a pod
// its own annotation enrolls: an agent that is restarting enrolls the
// others from their records when it is back.
func ambientAdd(args *skel.CmdArgs, p pod, prev *current.Result) error {
	if !p.Kubernetes || p.Name == "" || p.Namespace == "" || args.Netns == "" {
		return nil
	}
	rec := podnetns.Pod{
		ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns,
		UID: p.UID, Namespace: p.Namespace, Name: p.Name,
		Annotations: podnetns.IstioAnnotations(p.Annotations),
	}
	for _, ip := range prev.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
			rec.IPs = append(rec.IPs, a.Unmap())
		}
	}
	if _, err := os.Stat(socketPath()); err != nil {
		return nil // the agent's ambient mode is off
	}
	if err := podnetns.Write(podsDir, rec); err != nil {
		return cnierr.Wrap(err, "record the pod's namespace for the node agent")
	}
	ctx, cancel := context.WithTimeout(context.Background(), podnetns.AskTimeout)
	defer cancel()
	answer, err := podnetns.Ask(ctx, agentSocket, rec.Record())
	switch {
	case errors.Is(err, podnetns.ErrNoAgent) && p.Annotations[annDataplaneMode] == "ambient":
		// Enrolled by its own annotation: it must not start before its
		// traffic goes to ztunnel.
		_ = podnetns.Remove(podsDir, args.ContainerID, args.IfName)
		return cnierr.TryAgain("ambient mode: the pod's %s annotation enrolls it, and %v", annDataplaneMode, err)
	case errors.Is(err, podnetns.ErrNoAgent):
		slog.Warn("the node agent does not answer; it enrolls the pod in ambient mode from its record when it is back", "error", err)
		return nil
	case err != nil:
		_ = podnetns.Remove(podsDir, args.ContainerID, args.IfName)
		return cnierr.TryAgain("ambient mode: %v", err)
	}
	slog.Info("ambient mode", "answer", answer)
	return nil
}

// ambientDel removes the pod's record and tells the agent, which forgets
// the pod (ztunnel's workload, the probe set's addresses). The agent's
// answer is not waited for long: DEL always finishes, and the agent
// forgets pods whose record is gone at its next round.
func ambientDel(args *skel.CmdArgs) error {
	if err := podnetns.Remove(podsDir, args.ContainerID, args.IfName); err != nil {
		return cnierr.Wrap(err, "remove the pod's namespace record")
	}
	if _, err := os.Stat(socketPath()); err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), delAskTimeout)
	defer cancel()
	if _, err := podnetns.Ask(ctx, agentSocket, (podnetns.Pod{ContainerID: args.ContainerID, IfName: args.IfName}).Record()); err != nil {
		slog.Info("the node agent forgets the pod at its next round", "error", err)
	}
	return nil
}

const delAskTimeout = 2 * time.Second

func socketPath() string {
	if agentSocket != "" {
		return agentSocket
	}
	return podnetns.Socket
}
