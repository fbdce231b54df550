package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/meshwire/meshwire/internal/agentsocket"
	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/ambientnode"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podproc"
	"github.com/meshwire/meshwire/internal/podstate"
	"github.com/meshwire/meshwire/internal/podwatch"
)

// AmbientOptions turn on Istio's ambient mode (docs/ambient.md).
type AmbientOptions struct {
	Config ambient.Config
	// Backend programs the rules; the host's, detected, when zero.
	Backend firewall.Backend
	// ZtunnelSocket is where ztunnel connects (nodelayout.ZtunnelSocket
	// when empty).
	ZtunnelSocket string
	// StateDir is the root of the node's state (nodelayout.StateDir when
	// empty): the pods' records, the plugin's socket to the agent.
	StateDir string
	// API reads the pods' and namespaces' labels from the API server
	// (Kubeconfig, or the in-cluster config when empty), for the pods of
	// node NodeName. Without it, a pod is enrolled by its own
	// annotation istio.io/dataplane-mode=ambient, which the runtime
	// passes to the plugin.
	API        bool
	Kubeconfig string
	NodeName   string
	// Client is the API server's client in place of Kubeconfig's (tests).
	Client kubernetes.Interface
}

// ambientAgent is the agent's ambient mode at run time: it decides which
// pods are enrolled (the API server's labels, or the pods' annotations)
// and hands each pod's record and decision down to the node
// (ambientnode), which does the rest.
type ambientAgent struct {
	o      AmbientOptions
	layout nodelayout.Layout
	store  podstate.Store
	node   *ambientnode.Node
	watch  *podwatch.Watcher // nil without the API
	kick   chan struct{}     // a reconcile wanted (a label changed)
	// unfound are the pods adopt could not find a namespace for, logged
	// once each (reconcile's goroutine only).
	unfound map[string]bool
}

// startAmbient starts ambient mode: the pods enrolled before read back,
// the host rule installed, the ZDS server and the plugin's socket
// listening, the API watched. What it started stops with ctx, and stop
// takes back the host rule.
func startAmbient(ctx context.Context, o AmbientOptions) (_ *ambientAgent, err error) {
	if o.ZtunnelSocket == "" {
		o.ZtunnelSocket = nodelayout.ZtunnelSocket
	}
	if o.Backend == (firewall.Backend{}) {
		o.Backend = firewall.Detect(ctx)
	}
	l := nodelayout.At(o.StateDir)
	a := &ambientAgent{o: o, layout: l, store: podstate.New(l), kick: make(chan struct{}, 1), unfound: map[string]bool{}}
	node, err := ambientnode.New(ambientnode.Options{Config: o.Config, Backend: o.Backend, Store: a.store, ZtunnelSocket: o.ZtunnelSocket})
	if err != nil {
		return nil, fmt.Errorf("ambient mode: %w", err)
	}
	a.node = node
	defer func() {
		if err != nil {
			_, _ = a.stop() // the ZDS server closed, the host rule removed unless pods are enrolled
		}
	}()
	if err := node.InstallHost(ctx); err != nil {
		return nil, fmt.Errorf("ambient mode: %w", err)
	}
	go func() {
		if err := node.Serve(ctx); err != nil && ctx.Err() == nil {
			slog.Error("ZDS server stopped", "error", err)
		}
	}()
	if o.API {
		c := o.Client
		if c == nil {
			if c, err = podwatch.Client(o.Kubeconfig); err != nil {
				return nil, fmt.Errorf("ambient mode: the API server: %w", err)
			}
		}
		if o.NodeName == "" {
			return nil, errors.New("ambient mode: the API server's pods of which node? (--node-name, or NODE_NAME)")
		}
		if a.watch, err = podwatch.Start(ctx, c, o.NodeName, func(string) { a.wake() }); err != nil {
			return nil, fmt.Errorf("ambient mode: watch the API server: %w", err)
		}
	}
	ln, err := agentsocket.Listen(l.AgentSocket())
	if err != nil {
		return nil, fmt.Errorf("ambient mode: %w", err)
	}
	go agentsocket.Serve(ctx, ln, func(ctx context.Context, name string) (string, error) {
		return a.sync(ctx, name, true)
	})
	how := "the pods' own annotation " + ambient.LabelDataplaneMode + "=ambient"
	if a.watch != nil {
		how = "the API server's labels of node " + o.NodeName + "'s pods and their namespaces"
	}
	slog.Info("ambient mode on; pods enrolled by "+how, "rules", o.Backend.String(), "ztunnelSocket", o.ZtunnelSocket, "agentSocket", l.AgentSocket())
	return a, nil
}

// Ambient is ambient mode running on its own, without the rest of the
// agent (no installer, no fast path, no HTTP endpoints): what `meshwire
// demo` runs in its own process.
type Ambient struct {
	a      *ambientAgent
	cancel context.CancelFunc
	done   chan struct{}
}

// StartAmbient starts ambient mode as `meshwire node --ambient` does
// (startAmbient) with its reconcile loop: a round at once, then every
// interval (10s when zero) and when the API server shows a change. Stop
// ends it; so does ctx, but only Stop waits for the stop.
func StartAmbient(ctx context.Context, o AmbientOptions, interval time.Duration) (*Ambient, error) {
	if interval <= 0 {
		interval = 10 * time.Second
	}
	ctx, cancel := context.WithCancel(ctx)
	a, err := startAmbient(ctx, o)
	if err != nil {
		cancel()
		return nil, err
	}
	x := &Ambient{a: a, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(x.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			guard("ambient mode's round", func() { a.reconcile(ctx) })
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-a.kick:
			}
		}
	}()
	return x, nil
}

// Stop stops ambient mode as the agent's stop does: the enrolled pods
// stay as they are; the host rule and the probe sets go when none is.
// It reports whether they went.
func (x *Ambient) Stop() (hostRemoved bool, err error) {
	x.cancel()
	<-x.done
	return x.a.stop()
}

// ZtunnelsConnected is how many ztunnels are connected to the ZDS socket.
func (x *Ambient) ZtunnelsConnected() int { return x.a.node.Ztunnels().Connected }

// Enrolled is how many pods are enrolled.
func (x *Ambient) Enrolled() int { return x.a.node.Stats().Enrolled }

// Backend is the firewall the rules are programmed with.
func (x *Ambient) Backend() firewall.Backend { return x.a.o.Backend }

// removeAmbientSocket removes the plugin's socket (why: for the log), for
// an agent whose ambient mode is off or that is uninstalled: the plugin
// then stops recording pods for an agent.
func removeAmbientSocket(l nodelayout.Layout, why string) {
	if err := os.Remove(l.AgentSocket()); err == nil {
		slog.Info(why+": removed the plugin's socket", "path", l.AgentSocket())
	}
}

func (a *ambientAgent) wake() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// sync reads the record named name, decides for it and hands both to the
// node; atAdd: the plugin asks at the pod's ADD.
func (a *ambientAgent) sync(ctx context.Context, name string, atAdd bool) (string, error) {
	rec, ok, err := a.store.Read(name)
	if err != nil {
		return "", err
	}
	var d ambientnode.Decision
	if ok {
		d = a.decide(rec, atAdd)
	}
	return a.node.Sync(ctx, name, rec, ok, d, atAdd)
}

// decide is the enrollment of one pod: by the API server's labels when it
// is watched, else by the pod's annotations.
func (a *ambientAgent) decide(r podstate.Record, atAdd bool) ambientnode.Decision {
	if !r.Kubernetes() {
		return ambientnode.Decision{Why: "not a Kubernetes pod"}
	}
	if a.watch == nil {
		return byAnnotations(r)
	}
	wait := time.Duration(0)
	if atAdd {
		wait = 3 * time.Second
	}
	w, ok := a.lookup(r, wait)
	if !ok {
		return ambientnode.Decision{Why: "the API server shows no such pod on this node"}
	}
	if w.Terminating {
		return ambientnode.Decision{Why: "the pod's containers are gone for good (phase Succeeded or Failed)"}
	}
	why := w.Why
	if w.OverridesErr != nil {
		why += "; " + w.OverridesErr.Error()
	}
	return ambientnode.Decision{Enrolled: w.Enrolled, Why: why, Overrides: w.Overrides, UID: w.UID, ServiceAccount: w.ServiceAccount, IPs: w.IPs}
}

// lookup finds the pod of a record in the API server's pods: by uid, or
// by name (the runtime passed no uid, or a static pod's, which its mirror
// pod does not have). A pod just created may not be in the watch's cache
// yet: it is waited for up to wait.
func (a *ambientAgent) lookup(r podstate.Record, wait time.Duration) (podwatch.APIPod, bool) {
	deadline := time.Now().Add(wait)
	for {
		if w, ok := a.watch.Pod(r.UID); ok && r.UID != "" {
			return w, true
		}
		for _, w := range a.watch.Pods() {
			if w.Namespace == r.Namespace && w.Name == r.Name {
				return w, true
			}
		}
		if time.Now().After(deadline) {
			return podwatch.APIPod{}, false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// byAnnotations enrolls a pod by its own annotation
// istio.io/dataplane-mode (read as Istio reads the label), with the same
// exclusions as the API's.
func byAnnotations(r podstate.Record) ambientnode.Decision {
	meta := ambient.PodMeta{Labels: map[string]string{}, Annotations: r.Annotations}
	if v, ok := r.Annotations[ambient.LabelDataplaneMode]; ok {
		meta.Labels[ambient.LabelDataplaneMode] = v
	}
	ok, why := ambient.Enrolled(meta, nil)
	if !ok {
		return ambientnode.Decision{Why: why}
	}
	ov, err := ambient.ParseOverrides(r.Annotations)
	if err != nil {
		why += "; " + err.Error()
	}
	return ambientnode.Decision{Enrolled: true, Why: why, Overrides: ov}
}

// reconcile is one round over every pod: the records, and the pods
// enrolled whose record is gone.
func (a *ambientAgent) reconcile(ctx context.Context) {
	a.adopt()
	recs, err := a.store.List()
	if err != nil {
		slog.Warn("ambient mode: read the pods' records", "error", err)
		return
	}
	names := a.node.Enrolled()
	for name, r := range recs {
		if r.Kubernetes() {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		if ctx.Err() != nil {
			return
		}
		if _, err := a.sync(ctx, name, false); err != nil && ctx.Err() == nil {
			slog.Warn("ambient mode", "record", name, "error", err)
		}
	}
}

// adopt writes the record the plugin's ADD would have written for each
// pod the API server shows enrolled on this node, with addresses, that no
// record names: a pod that started before ambient mode was on (its ADD
// wrote none). Its namespace and sandbox are found through its processes
// (package podproc; /proc is read once a round, and only when a pod has
// no record), so that its DEL removes the record as for any other pod;
// one not found is logged once and looked for again each round.
// reconcile then enrolls it as it enrolls a recorded pod.
func (a *ambientAgent) adopt() {
	if a.watch == nil {
		return
	}
	recs, err := a.store.List()
	if err != nil {
		slog.Warn("ambient mode: read the pods' records", "error", err)
		return
	}
	recorded := map[string]bool{}
	for _, r := range recs {
		recorded[r.UID], recorded[r.Key()] = true, true
	}
	var procs *podproc.Processes // read once a round, when a pod needs it
	wanted := map[string]bool{}
	defer func() {
		for uid := range a.unfound {
			if !wanted[uid] {
				delete(a.unfound, uid) // recorded since, or gone
			}
		}
	}()
	for _, w := range a.watch.Pods() {
		if !w.Enrolled || w.Terminating || len(w.IPs) == 0 || recorded[w.UID] || recorded[w.Namespace+"/"+w.Name] {
			continue
		}
		wanted[w.UID] = true
		if procs == nil {
			if procs, err = podproc.ReadProcesses(); err != nil {
				slog.Warn("ambient mode: read the processes", "error", err)
				return
			}
		}
		found, err := procs.Find(w.UID, w.ContainerIDs)
		if err == nil && found.ContainerID == "" {
			err = fmt.Errorf("pod %s: its sandbox's cgroup names no container", w.UID)
		}
		pod := w.Namespace + "/" + w.Name
		if err != nil {
			if !a.unfound[w.UID] {
				slog.Warn("pod "+pod+" is enrolled and has no record", "pod", pod, "error", err)
				a.unfound[w.UID] = true
			}
			continue
		}
		// kubelet names every pod's interface eth0.
		rec := podstate.Record{ContainerID: found.ContainerID, IfName: "eth0", Netns: found.Netns,
			UID: w.UID, Namespace: w.Namespace, Name: w.Name, IPs: w.IPs}
		err = rec.Identify()
		if err == nil {
			err = a.store.Put(rec)
		}
		if err != nil {
			slog.Warn("pod "+pod+": could not record it", "pod", pod, "error", err)
			continue
		}
		slog.Info("pod "+pod+" started before ambient mode was on: recorded from its processes", "pod", pod, "netns", found.Netns, "containerID", found.ContainerID)
	}
}

// stop leaves the enrolled pods as they are (their rules, ztunnel's
// hold on them): a restarted agent takes them back. The host rule goes
// when no pod is enrolled.
// The plugin's socket stays: a pod added while the agent is away is
// told no agent answers, and enrolled from its record when it is back.
// It reports whether the host rule went.
func (a *ambientAgent) stop() (hostRemoved bool, err error) {
	_ = a.node.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	removed, err := a.node.RemoveHost(ctx)
	switch {
	case err != nil:
		slog.Error("ambient mode: could not remove the host's probe rule", "error", err)
		return false, err
	case removed:
		slog.Info("ambient mode: no pod enrolled; host probe rule removed")
	default:
		slog.Info("ambient mode: pods stay enrolled (their rules, ztunnel's hold on them); the host probe rule stays")
	}
	return removed, nil
}

// writeMetrics adds ambient mode's gauges and counters.
func (a *ambientAgent) writeMetrics(e *exposition) {
	ns := a.node.Stats()
	zs := a.node.Ztunnels()
	e.single("meshwire_ambient_enrolled_pods", "gauge", "Pods enrolled in ambient mode: in-pod rules installed, handed to ztunnel.", float64(ns.Enrolled))
	e.single("meshwire_ambient_enrollments_total", "counter", "Enrollments of a pod (or of its changed overrides).", float64(ns.Enrollments))
	e.single("meshwire_ambient_unenrollments_total", "counter", "Pods taken out of ambient mode or forgotten when gone.", float64(ns.Unenrollments))
	e.single("meshwire_ambient_enroll_failures_total", "counter", "Enrollments that failed (see the agent's log).", float64(ns.EnrollFailures))
	e.single("meshwire_ambient_ztunnels_connected", "gauge", "ztunnels connected to the node agent's ZDS socket.", float64(zs.Connected))
	e.single("meshwire_ambient_handoffs_total", "counter", "Pods handed to ztunnel and acknowledged.", float64(zs.Handoffs))
	e.single("meshwire_ambient_handoff_failures_total", "counter", "Hand-offs to ztunnel that failed: an error ack, a timeout, a broken connection.", float64(zs.FailedHandoffs))
}
