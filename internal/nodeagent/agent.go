// Package nodeagent is `meshwire node`, the one process a DaemonSet runs on
// every node. It installs the plugins and keeps meshwire in the node's CNI
// config (package installer), attaches the eBPF fast path and attaches it
// again if it goes, serves /healthz, /readyz and Prometheus /metrics, and on
// SIGTERM takes the config change and the fast path back.
package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshwire/meshwire/ebpf/capture"
	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/internal/buildinfo"
	"github.com/meshwire/meshwire/internal/installer"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podstate"
)

// Options are `meshwire node`'s.
type Options struct {
	Install installer.Options
	// Fastpath, when set, is the fast path the agent attaches and owns.
	Fastpath *fastpath.Config
	// Listen is the address of the HTTP endpoints.
	Listen string
	// PluginLog is where the agent reads the plugins' JSON log; default
	// Install.PluginLog (the same path inside and outside the container).
	PluginLog string
	// PluginLogMaxSize is the size at which the agent rotates the log
	// (default 16 MiB; negative: never).
	PluginLogMaxSize int64
	// Interval is how often the agent checks the fast path and reads the
	// log (default 10s).
	Interval time.Duration
	// StateDir is the root of the node's state (nodelayout.StateDir
	// when empty): the pods' records the agent reads and repairs from,
	// and ambient mode's socket.
	StateDir string
	// Ambient, when set, turns on Istio's ambient mode.
	Ambient *AmbientOptions
	// RuntimeGC, when set, runs the CNI GC of the node's network against
	// the runtime's pod sandboxes (over CRI) every RuntimeGC.Every.
	RuntimeGC *RuntimeGC
}

// Agent is a running node agent.
type Agent struct {
	o    Options
	in   *installer.Installer
	fp   *FastpathOwner // nil without Options.Fastpath
	plog *pluginLog     // nil without a plugin log
	beat atomic.Int64   // when the loop last went round (UnixNano)

	mu       sync.Mutex
	fpErr    error  // why the fast path is not attached, as last seen
	attaches uint64 // attachments the agent made
	stopping bool

	layout    nodelayout.Layout
	store     podstate.Store
	records   nsSweep[string] // the sweep of the records of namespaces gone
	rep       *Repairer
	repairing atomic.Bool    // a round of rep is running
	repairs   sync.WaitGroup // the rounds running, waited for at stop
	repairCtx context.Context

	amb            atomic.Pointer[ambientAgent] // nil without Options.Ambient
	reconciling    atomic.Bool                  // a round of amb's is running
	reconcileAgain atomic.Bool                  // and another is wanted after it

	collecting atomic.Bool // a round of the runtime GC is running
	lastGC     time.Time   // when the last one started

	lastSweep                    time.Time // of the registrations (FastpathOwner.Collect)
	sweepErr                     error
	collected, collectedPolicies uint64
}

// sweepEvery is how many intervals apart the agent looks for registrations
// of namespaces that are gone: a walk of /proc (every process's tasks, open
// files and mounts) is heavier than a check of the pins.
const sweepEvery = 6

// New checks o and returns an agent (nothing runs yet).
func New(o Options) (*Agent, error) {
	if o.Interval <= 0 {
		o.Interval = 10 * time.Second
	}
	if o.PluginLogMaxSize == 0 {
		o.PluginLogMaxSize = 16 << 20
	}
	if o.PluginLog == "" {
		o.PluginLog = o.Install.PluginLog
	}
	if o.Listen == "" {
		return nil, errors.New("no address to listen on")
	}
	if o.Install.Once {
		return nil, errors.New("the node agent keeps the config applied; it has no --once")
	}
	if g := o.RuntimeGC; g != nil {
		if g.Every <= 0 {
			g.Every = 5 * time.Minute
		}
		if g.Options.MinAge < 0 {
			return nil, errors.New("the runtime GC's min-age is negative")
		}
	}
	in, err := installer.New(o.Install)
	if err != nil {
		return nil, err
	}
	if o.Ambient != nil {
		o.Ambient.StateDir = o.StateDir
	}
	l := nodelayout.At(o.StateDir)
	store := podstate.New(l)
	a := &Agent{o: o, in: in, layout: l, store: store, rep: &Repairer{BinDir: o.Install.BinDir, Store: store}}
	// The first runtime GC a round after the start: the installer's
	// config in place, the runtime's sandboxes back after a reboot.
	a.lastGC = time.Now()
	if o.Fastpath != nil {
		a.fp = &FastpathOwner{Config: *o.Fastpath, Adopt: true, Store: store}
		if a.fp.Config.PinDir == "" {
			a.fp.Config.PinDir = fastpath.DefaultPinDir
		}
	}
	if o.PluginLog != "" {
		a.plog = newPluginLog(o.PluginLog, o.PluginLogMaxSize)
	}
	return a, nil
}

// Run serves the endpoints and does the agent's work until ctx ends, then
// stops: the installer's cleanup, the fast path detached.
// It returns early, after the same stop, when the installer fails for good
// (it cannot install the plugins).
func (a *Agent) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", a.o.Listen)
	if err != nil {
		return fmt.Errorf("serve the probes and metrics: %w", err)
	}
	srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	slog.Info("serving /healthz, /readyz and /metrics", "address", ln.Addr().String())
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()

	repairCtx, stopRepairs := context.WithCancel(ctx)
	defer stopRepairs()
	a.repairCtx = repairCtx
	// The stores of an earlier version, moved into the pods' records
	// before anything reads them (a node upgraded in place).
	switch m, err := a.store.Migrate(); {
	case err != nil:
		slog.Error("could not move an earlier version's records of the pods (tried again at the next start)", "error", err)
	case m.Any():
		slog.Info("moved an earlier version's records of the pods", "dir", a.store.Dir(),
			"calls", m.Calls, "fastpathPolicies", m.Fastpath, "enrolled", m.Enrolled, "enrolledGone", m.Dropped)
	}
	var kick chan struct{}
	if a.o.Ambient == nil {
		removeAmbientSocket(a.layout, "ambient mode off")
	}
	if a.o.Ambient != nil {
		amb, err := startAmbient(repairCtx, *a.o.Ambient)
		if err != nil {
			return err
		}
		a.amb.Store(amb)
		defer func() { _, _ = amb.stop() }()
		kick = amb.kick
	}
	a.tick()
	instCtx, stopInstaller := context.WithCancel(ctx)
	defer stopInstaller()
	instDone := make(chan error, 1)
	go func() { instDone <- a.in.Run(instCtx) }()
	t := time.NewTicker(a.o.Interval)
	defer t.Stop()
	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err := <-instDone:
			instDone = nil
			if err == nil {
				err = errors.New("stopped by itself")
			}
			runErr = fmt.Errorf("installer: %w", err)
			break loop
		case <-t.C:
			a.tick()
		case <-kick:
			a.startReconcile()
		}
	}
	a.mu.Lock()
	a.stopping = true
	a.mu.Unlock()
	slog.Info("stopping")
	stopRepairs()
	a.repairs.Wait()
	stopInstaller()
	if instDone != nil {
		if err := <-instDone; err != nil {
			runErr = fmt.Errorf("installer: %w", err)
		}
	}
	if a.in.TookBack() {
		// Uninstalled: the plugin is out of the conflists, and no next
		// agent will answer on the socket (a rollout keeps it, so that
		// the plugin goes on recording pods for the next agent).
		removeAmbientSocket(a.layout, "the config change taken back")
	}
	if a.fp != nil {
		runErr = errors.Join(runErr, a.fp.Release())
	}
	return runErr
}

// tick is one round of the loop.
func (a *Agent) tick() {
	a.beat.Store(time.Now().UnixNano())
	if a.fp != nil {
		err := a.fp.Ensure()
		if err != nil && (a.fpErr == nil || a.fpErr.Error() != err.Error()) {
			slog.Error("the fast path is not attached; trying again every "+a.o.Interval.String(), "error", err)
		}
		a.mu.Lock()
		a.fpErr, a.attaches = err, a.fp.Attaches()
		a.mu.Unlock()
	}
	if time.Since(a.lastSweep) >= sweepEvery*a.o.Interval {
		a.lastSweep = time.Now()
		err := a.sweep()
		if err != nil && (a.sweepErr == nil || a.sweepErr.Error() != err.Error()) {
			slog.Warn("sweep of what pods gone without a DEL left", "error", err)
		}
		a.sweepErr = err
	}
	if a.plog != nil {
		a.plog.read()
	}
	a.startRepair()
	a.startReconcile()
	a.startRuntimeGC()
}

// startReconcile starts a round of ambient mode's pods in the background
// unless one is running.
func (a *Agent) startReconcile() {
	amb := a.amb.Load()
	if amb == nil || a.repairCtx == nil {
		return
	}
	if !a.reconciling.CompareAndSwap(false, true) {
		a.reconcileAgain.Store(true)
		return
	}
	a.repairs.Add(1)
	go func() {
		defer a.repairs.Done()
		defer a.reconciling.Store(false)
		for again := true; again && a.repairCtx.Err() == nil; again = a.reconcileAgain.Swap(false) {
			guard("ambient mode's round", func() { amb.reconcile(a.repairCtx) })
		}
	}()
}

// startRepair starts a round of the meshed pods' checks in the background
// unless one is running (a round runs one CHECK per pod, more than a tick
// should wait for).
//
// None starts before the installer has put this build's plugins into the
// CNI binary directory. Until then the directory holds what was there
// before the agent started: on a node upgraded in place, the earlier
// build's intercept plugin, which knows neither the pods' records the
// agent moved at its start (it would repeat an ADD of a call it no
// longer finds as nothing, and the agent would count a repair) nor what
// this build's plugin checks. The rounds are this build's to run.
func (a *Agent) startRepair() {
	if a.repairCtx == nil || !a.in.State().BinariesInstalled {
		return
	}
	if !a.repairing.CompareAndSwap(false, true) {
		return
	}
	a.repairs.Add(1)
	go func() {
		defer a.repairs.Done()
		defer a.repairing.Store(false)
		var err error
		guard("the meshed pods' checks", func() { err = a.rep.Round(a.repairCtx) })
		if err != nil && a.repairCtx.Err() == nil {
			slog.Warn("could not check the meshed pods", "error", err)
		}
	}()
}

// Handler serves /healthz, /readyz and /metrics.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.HandleFunc("GET /metrics", a.metrics)
	return mux
}

// stale is how long the loop may go without a round before /healthz fails:
// three rounds, and the 30 s an attach may wait for the node's fast-path
// lock.
func (a *Agent) stale() time.Duration { return 3*a.o.Interval + 30*time.Second }

// healthz fails when the loop has stopped going round.
func (a *Agent) healthz(w http.ResponseWriter, _ *http.Request) {
	if since := time.Since(time.Unix(0, a.beat.Load())); since > a.stale() {
		http.Error(w, fmt.Sprintf("the agent's loop last ran %s ago", since.Round(time.Second)), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok")
}

// notReady lists why the node is not ready; none when it is.
func (a *Agent) notReady() []string {
	var why []string
	st := a.in.State()
	switch {
	case !st.BinariesInstalled && st.LastError != "":
		why = append(why, "plugins not installed: "+st.LastError)
	case !st.BinariesInstalled:
		why = append(why, "plugins not installed yet")
	case !st.Applied && st.LastError != "":
		why = append(why, "config not applied: "+st.LastError)
	case !st.Applied:
		why = append(why, "config not applied yet")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fp != nil {
		switch {
		case a.fpErr != nil:
			why = append(why, "fast path not attached: "+a.fpErr.Error())
		case !fastpath.IsAttached(a.fp.Config.PinDir):
			why = append(why, "fast path not attached (attached again within "+a.o.Interval.String()+")")
		}
	}
	if a.stopping {
		why = append(why, "stopping")
	}
	return why
}

// readyz is ready once the plugins are installed, the config applied and
// the fast path (when asked for) attached.
func (a *Agent) readyz(w http.ResponseWriter, _ *http.Request) {
	if why := a.notReady(); len(why) > 0 {
		http.Error(w, strings.Join(why, "\n"), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ready")
}

func (a *Agent) metrics(w http.ResponseWriter, _ *http.Request) {
	var e exposition
	version, commit := buildinfo.VersionCommit()
	e.family("meshwire_build_info", "gauge", "The meshwire build the agent runs (always 1).")
	e.sample("meshwire_build_info", 1, "version", version, "commit", commit)
	e.single("meshwire_node_ready", "gauge", "Whether /readyz answers ready.", boolValue(len(a.notReady()) == 0))

	st := a.in.State()
	e.single("meshwire_installer_binaries_installed", "gauge", "Whether every plugin is installed in the CNI binary directory.", boolValue(st.BinariesInstalled))
	e.single("meshwire_installer_config_applied", "gauge", "Whether the last check of the CNI config directory left meshwire's config in place.", boolValue(st.Applied))
	e.single("meshwire_installer_applies_total", "counter", "Checks of the CNI config directory that left meshwire's config in place (rewriting it when needed).", float64(st.Applies))
	e.single("meshwire_installer_apply_failures_total", "counter", "Checks of the CNI config directory that failed (see the agent's log).", float64(st.Failures))

	rs := a.rep.Stats()
	e.single("meshwire_intercept_pods", "gauge", "Meshed pods whose interception the agent checks every interval (the intercept plugin's recorded calls).", float64(rs.Pods))
	e.single("meshwire_intercept_check_rounds_total", "counter", "Rounds of checks that went through every meshed pod.", float64(rs.Rounds))
	e.single("meshwire_intercept_repairs_total", "counter", "Pods whose interception the agent found missing or changed and installed again.", float64(rs.Repairs))
	e.single("meshwire_intercept_repair_failures_total", "counter", "Repairs that failed (see the agent's log).", float64(rs.Failures))
	e.single("meshwire_intercept_check_errors_total", "counter", "Checks of a meshed pod that failed otherwise than on drift (see the agent's log).", float64(rs.Errors))

	if amb := a.amb.Load(); amb != nil {
		amb.writeMetrics(&e)
	}
	a.writeFastpath(&e)
	if a.plog != nil {
		a.plog.read()
		a.plog.write(&e)
	}
	w.Header().Set("Content-Type", contentType)
	_, _ = w.Write(e.b.Bytes())
}

// writeFastpath adds the fast path's state and counters, read from its pins.
func (a *Agent) writeFastpath(e *exposition) {
	dir, cgroup := fastpath.DefaultPinDir, ""
	a.mu.Lock()
	attaches, collected, collectedPolicies := a.attaches, a.collected, a.collectedPolicies
	if a.fp != nil {
		dir, cgroup = a.fp.Config.PinDir, a.fp.Config.Cgroup
	}
	a.mu.Unlock()
	if n, err := fastpath.Sockhashes(); err == nil {
		e.single("meshwire_fastpath_sockhashes", "gauge", "The fast path's sockhashes in the kernel: the attached one, and earlier ones that sockets opened before a detach or an upgrade still keep.", float64(n))
	}
	if _, others, err := fastpath.OtherSockops(cgroup); err == nil {
		e.single("meshwire_fastpath_other_sockops_programs", "gauge", "Sockops programs attached at the fast path's cgroup that are not meshwire's: they see the same sockets.", float64(len(others)))
	}
	e.single("meshwire_fastpath_managed", "gauge", "Whether this agent attaches the fast path.", boolValue(a.fp != nil))
	e.single("meshwire_fastpath_attaches_total", "counter", "Times this agent attached the fast path.", float64(attaches))
	if cst, err := capture.ReadStatus(""); err == nil {
		e.single("meshwire_capture_attached", "gauge", "Whether the ebpf interception programs are attached.", boolValue(cst.Attached))
		e.single("meshwire_capture_pods", "gauge", "Pods registered for ebpf interception.", float64(cst.Pods))
	}
	e.single("meshwire_capture_collected_total", "counter", "Registrations for ebpf interception this agent forgot because their pod's namespace was gone without a DEL.", float64(collected))
	e.single("meshwire_fastpath_policies_collected_total", "counter", "Fast-path pod policies this agent forgot because their pod's namespace was gone without a DEL.", float64(collectedPolicies))
	st, err := fastpath.ReadStatus(dir)
	e.single("meshwire_fastpath_attached", "gauge", "Whether the fast path is attached.", boolValue(st.Attached))
	if err != nil || !st.Attached {
		return // the counters went with the pins
	}
	e.single("meshwire_fastpath_sockets", "gauge", "Sockets on the fast path now.", float64(st.LiveSockets))
	e.single("meshwire_fastpath_pod_policies", "gauge", "Meshed pods with a fast-path policy.", float64(st.PodPolicies))
	for _, c := range []struct {
		name, help string
		v          uint64
	}{
		{"meshwire_fastpath_sockets_total", "Sockets taken onto the fast path since it was attached.", st.Sockets},
		{"meshwire_fastpath_pairs_total", "Connections paired (both ends on the fast path) since it was attached.", st.Pairs},
		{"meshwire_fastpath_peer_pairs_total", "Of the pairs, connections between the sidecars of two pods of this node.", st.PeerPairs},
		{"meshwire_fastpath_redirected_messages_total", "Messages the fast path's program redirected since it was attached (its verdicts: a redirect the kernel then refuses still counts).", st.RedirectedMessages},
		{"meshwire_fastpath_redirected_bytes_total", "Bytes of those messages.", st.RedirectedBytes},
		{"meshwire_fastpath_fallback_messages_total", "Messages of fast-path sockets sent on TCP since it was attached.", st.Fallbacks},
		{"meshwire_fastpath_kept_for_proxy_messages_total", "Of the fallback messages, those toward a proxy that the pod's policy kept on TCP.", st.KeptForProxy},
		{"meshwire_fastpath_ambiguous_total", "Client sockets that shared an endpoint with another (left on TCP) since it was attached.", st.Ambiguous},
	} {
		e.single(c.name, "counter", c.help, float64(c.v))
	}
}
