package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/ambientnode"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/podnetns"
	"github.com/meshwire/meshwire/internal/podwatch"
	"github.com/meshwire/meshwire/internal/zds"
)

// AmbientOptions turn on Istio's ambient mode (docs/ambient.md).
type AmbientOptions struct {
	Config ambient.Config
	// Backend programs the rules; the host's, detected, when zero.
	Backend firewall.Backend
	// ZtunnelSocket is where ztunnel connects (zds.SocketPath when
	// empty); AgentSocket where the intercept plugin asks
	// (podnetns.Socket).
	ZtunnelSocket, AgentSocket string
	// PodsDir and StateDir: podnetns.Dir and ambientnode.StateDir when
	// empty.
	PodsDir, StateDir string
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

// ambientAgent is the agent's ambient mode at run time.
type ambientAgent struct {
	o     AmbientOptions
	node  *ambientnode.Node
	zds   *zds.Server
	watch *podwatch.Watcher // nil without the API
	kick  chan struct{}     // a reconcile wanted (a label changed)
	logf  func(string, ...any)
	// unfound are the pods adopt could not find a namespace for, logged
	// once each (reconcile's goroutine only).
	unfound map[string]bool
}

// The agent is ambientnode's hand-off to ztunnel, over its ZDS server
// (which starts after the node, whose enrolled pods are its snapshot).

func (a *ambientAgent) Add(ctx context.Context, w ambientnode.Workload) error {
	return a.zds.Add(ctx, zdsWorkload(w))
}
func (a *ambientAgent) Del(ctx context.Context, uid string) error { return a.zds.Del(ctx, uid) }
func (a *ambientAgent) Connected() bool                           { return a.zds.Stats().Connected > 0 }

func zdsWorkload(w ambientnode.Workload) zds.Workload {
	return zds.Workload{UID: w.UID, Name: w.Name, Namespace: w.Namespace, ServiceAccount: w.ServiceAccount, Netns: w.Netns}
}

// startAmbient starts ambient mode: the pods enrolled before read back,
// the host rule installed, the ZDS server and the plugin's socket
// listening, the API watched. What it started stops with ctx, and stop
// takes back the host rule.
func startAmbient(ctx context.Context, o AmbientOptions, logf func(string, ...any)) (_ *ambientAgent, err error) {
	if o.ZtunnelSocket == "" {
		o.ZtunnelSocket = zds.SocketPath
	}
	if o.AgentSocket == "" {
		o.AgentSocket = podnetns.Socket
	}
	if o.Backend == (firewall.Backend{}) {
		o.Backend = firewall.Detect(ctx)
	}
	a := &ambientAgent{o: o, kick: make(chan struct{}, 1), logf: logf, unfound: map[string]bool{}}
	node, err := ambientnode.New(ambientnode.Options{
		Config: o.Config, Backend: o.Backend, PodsDir: o.PodsDir, StateDir: o.StateDir,
		Decide: a.decide, Ztunnel: a, Logf: logf,
	})
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
	snapshot := func() []zds.Workload {
		var out []zds.Workload
		for _, w := range node.Workloads() {
			out = append(out, zdsWorkload(w))
		}
		return out
	}
	srv, err := zds.Listen(o.ZtunnelSocket, snapshot, logf)
	if err != nil {
		return nil, fmt.Errorf("ambient mode: %w", err)
	}
	a.zds = srv
	go func() {
		if err := srv.Serve(ctx); err != nil && ctx.Err() == nil {
			logf("ambient: ZDS server: %v", err)
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
	ln, err := listenUnix(o.AgentSocket)
	if err != nil {
		return nil, fmt.Errorf("ambient mode: %w", err)
	}
	go podnetns.Serve(ctx, ln, func(ctx context.Context, name string) (string, error) {
		return node.Sync(ctx, name, true)
	})
	how := "the pods' own annotation " + ambient.LabelDataplaneMode + "=ambient"
	if a.watch != nil {
		how = "the API server's labels of node " + o.NodeName + "'s pods and their namespaces"
	}
	logf("ambient mode on (%s rules); ztunnel connects at %s; pods enrolled by %s", o.Backend, o.ZtunnelSocket, how)
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
func StartAmbient(ctx context.Context, o AmbientOptions, interval time.Duration, logf func(string, ...any)) (*Ambient, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if interval <= 0 {
		interval = 10 * time.Second
	}
	ctx, cancel := context.WithCancel(ctx)
	a, err := startAmbient(ctx, o, logf)
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
			_ = cnierr.Catch(func() error { a.reconcile(ctx); return nil })
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
func (x *Ambient) ZtunnelsConnected() int { return x.a.zds.Stats().Connected }

// Enrolled is how many pods are enrolled.
func (x *Ambient) Enrolled() int { return x.a.node.Stats().Enrolled }

// Backend is the firewall the rules are programmed with.
func (x *Ambient) Backend() firewall.Backend { return x.a.o.Backend }

// listenUnix listens on a Unix socket at path, in place of a socket a
// previous agent left.
//
// The socket file stays when the listener closes: while the agent is away
// (a rollout), the plugin still sees that ambient mode is on, records
// each new pod and is told no agent answers; the agent enrolls those pods
// from their records when it is back. An agent started without --ambient
// removes it (removeAmbientSocket).
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	return ln, nil
}

// removeAmbientSocket removes the plugin's socket at its default path,
// for an agent whose ambient mode is off: the plugin then stops recording
// pods for it.
func removeAmbientSocket(logf func(string, ...any)) {
	if err := os.Remove(podnetns.Socket); err == nil {
		logf("ambient mode off: removed %s", podnetns.Socket)
	}
}

func (a *ambientAgent) wake() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// decide is the enrollment of one pod: by the API server's labels when it
// is watched, else by the pod's annotations.
func (a *ambientAgent) decide(p podnetns.Pod, atAdd bool) ambientnode.Enrollment {
	if a.watch == nil {
		return byAnnotations(p)
	}
	wait := time.Duration(0)
	if atAdd {
		wait = 3 * time.Second
	}
	w, ok := a.lookup(p, wait)
	if !ok {
		return ambientnode.Enrollment{Why: "the API server shows no such pod on this node"}
	}
	if w.Terminating {
		return ambientnode.Enrollment{Why: "the pod's containers are gone for good (phase Succeeded or Failed)"}
	}
	why := w.Why
	if w.OverridesErr != nil {
		why += "; " + w.OverridesErr.Error()
	}
	return ambientnode.Enrollment{Enrolled: w.Enrolled, Why: why, Pod: w.Overrides, UID: w.UID, ServiceAccount: w.ServiceAccount, IPs: w.IPs}
}

// lookup finds the pod of a record in the API server's pods: by uid, or
// by name (the runtime passed no uid, or a static pod's, which its mirror
// pod does not have). A pod just created may not be in the watch's cache
// yet: it is waited for up to wait.
func (a *ambientAgent) lookup(p podnetns.Pod, wait time.Duration) (podwatch.Pod, bool) {
	deadline := time.Now().Add(wait)
	for {
		if w, ok := a.watch.Pod(p.UID); ok && p.UID != "" {
			return w, true
		}
		for _, w := range a.watch.Pods() {
			if w.Namespace == p.Namespace && w.Name == p.Name {
				return w, true
			}
		}
		if time.Now().After(deadline) {
			return podwatch.Pod{}, false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// byAnnotations enrolls a pod by its own annotation
// istio.io/dataplane-mode (read as Istio reads the label), with the same
// exclusions as the API's.
func byAnnotations(p podnetns.Pod) ambientnode.Enrollment {
	meta := ambient.PodMeta{Labels: map[string]string{}, Annotations: p.Annotations}
	if v, ok := p.Annotations[ambient.LabelDataplaneMode]; ok {
		meta.Labels[ambient.LabelDataplaneMode] = v
	}
	ok, why := ambient.Enrolled(meta, nil)
	if !ok {
		return ambientnode.Enrollment{Why: why}
	}
	pod, err := ambient.Overrides(p.Annotations)
	if err != nil {
		why += "; " + err.Error()
	}
	return ambientnode.Enrollment{Enrolled: true, Why: why, Pod: pod}
}

// reconcile is one round over every pod.
func (a *ambientAgent) reconcile(ctx context.Context) {
	a.adopt()
	if err := a.node.Reconcile(ctx); err != nil && ctx.Err() == nil {
		a.logf("ambient: %v", err)
	}
}

// adopt writes the record the plugin's ADD would have written for each
// pod the API server shows enrolled on this node, with addresses, that no
// record names: a pod that started before ambient mode was on (its ADD
// wrote none). Its namespace and sandbox are found through its processes
// (podnetns.Find; /proc is read once a round, and only when a pod has
// no record), so that its DEL removes the record as for any other pod;
// one not found is logged once and looked for again each round.
// Reconcile then enrolls it as it enrolls a recorded pod.
func (a *ambientAgent) adopt() {
	if a.watch == nil {
		return
	}
	recs, err := podnetns.List(a.o.PodsDir)
	if err != nil {
		a.logf("ambient: %v", err)
		return
	}
	recorded := map[string]bool{}
	for _, r := range recs {
		recorded[r.UID], recorded[r.Key()] = true, true
	}
	var procs *podnetns.Processes // read once a round, when a pod needs it
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
			if procs, err = podnetns.ReadProcesses(); err != nil {
				a.logf("ambient: %v", err)
				return
			}
		}
		found, err := procs.Find(w.UID, w.ContainerIDs)
		if err == nil && found.ContainerID == "" {
			err = fmt.Errorf("pod %s: its sandbox's cgroup names no container", w.UID)
		}
		if err != nil {
			if !a.unfound[w.UID] {
				a.logf("ambient: pod %s/%s is enrolled and has no record: %v", w.Namespace, w.Name, err)
				a.unfound[w.UID] = true
			}
			continue
		}
		// kubelet names every pod's interface eth0.
		rec := podnetns.Pod{ContainerID: found.ContainerID, IfName: "eth0", Netns: found.Netns,
			UID: w.UID, Namespace: w.Namespace, Name: w.Name, IPs: w.IPs}
		if err := podnetns.Write(a.o.PodsDir, rec); err != nil {
			a.logf("ambient: pod %s/%s: %v", w.Namespace, w.Name, err)
			continue
		}
		a.logf("ambient: pod %s/%s started before ambient mode was on: recorded from its processes (namespace %s, sandbox %s)", w.Namespace, w.Name, found.Netns, found.ContainerID)
	}
}

// stop leaves the enrolled pods as they are (their rules, ztunnel's
// hold on them): a restarted agent takes them back. The host rule goes
// when no pod is enrolled.
// The plugin's socket stays: a pod added while the agent is away is
// told no agent answers, and enrolled from its record when it is back.
// It reports whether the host rule went.
func (a *ambientAgent) stop() (hostRemoved bool, err error) {
	if a.zds != nil {
		_ = a.zds.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	removed, err := a.node.RemoveHost(ctx)
	switch {
	case err != nil:
		a.logf("ambient: remove the host's probe rule: %v", err)
		return false, err
	case removed:
		a.logf("ambient: no pod enrolled; host probe rule removed")
	default:
		a.logf("ambient: pods stay enrolled (their rules, ztunnel's hold on them); the host probe rule stays")
	}
	return removed, nil
}

// writeMetrics adds ambient mode's gauges and counters.
func (a *ambientAgent) writeMetrics(e *exposition) {
	ns := a.node.Stats()
	zs := a.zds.Stats()
	e.single("meshwire_ambient_enrolled_pods", "gauge", "Pods enrolled in ambient mode: in-pod rules installed, handed to ztunnel.", float64(ns.Enrolled))
	e.single("meshwire_ambient_enrollments_total", "counter", "Enrollments of a pod (or of its changed overrides).", float64(ns.Enrollments))
	e.single("meshwire_ambient_unenrollments_total", "counter", "Pods taken out of ambient mode or forgotten when gone.", float64(ns.Unenrollments))
	e.single("meshwire_ambient_enroll_failures_total", "counter", "Enrollments that failed (see the agent's log).", float64(ns.EnrollFailures))
	e.single("meshwire_ambient_ztunnels_connected", "gauge", "ztunnels connected to the node agent's ZDS socket.", float64(zs.Connected))
	e.single("meshwire_ambient_handoffs_total", "counter", "Pods handed to ztunnel and acknowledged.", float64(zs.Handoffs))
	e.single("meshwire_ambient_handoff_failures_total", "counter", "Hand-offs to ztunnel that failed: an error ack, a timeout, a broken connection.", float64(zs.FailedHandoffs))
}
