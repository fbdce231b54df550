//go:build cluster

package clustersuites

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/meshwire/meshwire/internal/proxylog"
	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

// latencyCut is issue 47's target: at 1,000 qps, same node, the fast path
// takes at least 30 % off the latency the sidecar adds at p50 (REDIRECT
// with the sidecar, minus no mesh).
const latencyCut = 0.30

// latencyConfig is one way of wiring the same fortio client and server.
type latencyConfig struct {
	Name    string
	NS      string
	Sidecar string // the sidecar's interception (REDIRECT or EBPF), "" for none
	Ambient bool   // the namespace enrolled in ambient mode (the stand-in)
	// Fastpath: meshwire's agent runs with --fastpath while this
	// configuration is measured (meshwire's cluster only).
	Fastpath bool
}

// The configurations, by network. Each namespace's pods serve the
// configurations that differ only in the agent's --fastpath: the same
// pods, measured with the fast path attached and detached.
var (
	latPlain      = latencyConfig{Name: "no mesh", NS: "mwk-lat-plain"}
	latPlainFP    = latencyConfig{Name: "no mesh, fast path attached", NS: "mwk-lat-plain", Fastpath: true}
	latRedirect   = latencyConfig{Name: "REDIRECT, sidecar", NS: "mwk-lat-redirect", Sidecar: "REDIRECT"}
	latRedirectFP = latencyConfig{Name: "REDIRECT, sidecar + fast path", NS: "mwk-lat-redirect", Sidecar: "REDIRECT", Fastpath: true}
	latEBPFFP     = latencyConfig{Name: "EBPF, sidecar + fast path", NS: "mwk-lat-ebpf", Sidecar: "EBPF", Fastpath: true}
	latAmbient    = latencyConfig{Name: "ambient, ztunnel stand-in", NS: "mwk-lat-ambient", Ambient: true, Fastpath: true}
	latIstioCNI   = latencyConfig{Name: "istio-cni REDIRECT, sidecar", NS: "mwk-lat-redirect", Sidecar: "REDIRECT"}
)

// latencyOrder is the order of the table's rows: network, configuration.
var latencyOrder = [][2]string{{"meshwire", latPlain.Name}, {"meshwire", latPlainFP.Name}, {"meshwire", latRedirect.Name},
	{"meshwire", latRedirectFP.Name}, {"meshwire", latEBPFFP.Name}, {"meshwire", latAmbient.Name},
	{"istio-cni", latPlain.Name}, {"istio-cni", latIstioCNI.Name}}

// latencyGroups are a network's configurations in groups that share the
// agent's --fastpath, the first group as the cluster starts (meshwire's
// DaemonSet ships with --fastpath), so that a round switches it once.
func latencyGroups(cni string) [][]latencyConfig {
	if cni == "istio-cni" {
		return [][]latencyConfig{{latPlain, latIstioCNI}}
	}
	return [][]latencyConfig{{latPlainFP, latRedirectFP, latEBPFFP, latAmbient}, {latPlain, latRedirect}}
}

// latencyLoad is one `fortio load` and what it cost.
type latencyLoad struct {
	Network   string  `json:"network"`
	Config    string  `json:"config"`
	Placement string  `json:"placement"` // "same node" or "other node"
	Payload   int     `json:"payload"`   // bytes of the POST's body, echoed back
	QPS       int     `json:"qps"`       // asked for; 0: as fast as it goes
	Round     int     `json:"round"`
	P50US     float64 `json:"p50Us"`
	P90US     float64 `json:"p90Us"`
	P99US     float64 `json:"p99Us"`
	ActualQPS float64 `json:"actualQps"`
	Requests  int64   `json:"requests"`
	Failed    int64   `json:"failed"`
	// PodsCPU is the CPU seconds every pod of the cluster's nodes spent
	// during the load (framework.PodsCPU), Machine the whole machine's.
	PodsCPU    float64 `json:"podsCpuS"`
	MachineCPU float64 `json:"machineCpuS"`
	// WallS is the span of the CPU samples around the load (fortio's
	// start and exit included); IdlePodsCPU the pods' CPU seconds per
	// second with no load, measured on the same cluster with the same
	// fast-path setting in the same round (latLeg.measureIdle).
	WallS       float64 `json:"wallS"`
	IdlePodsCPU float64 `json:"idlePodsCpuPerS"`
	// Load1 is the machine's load average over the minute before the
	// load began (/proc/loadavg): other users of the machine show here.
	Load1 float64 `json:"load1"`
}

func (l latencyLoad) key() string {
	return fmt.Sprintf("%s|%s|%s|%d|%d", l.Network, l.Config, l.Placement, l.Payload, l.QPS)
}

type latencySettings struct {
	duration    time.Duration
	connections int
	rounds      int
	payloads    []int
	rates       []int
	// idlePoll: each load with the machine's idle CPUs as they are
	// (false) and/or held polling (true, holdIdlePoll), LATENCY_IDLE_POLL.
	idlePoll []bool
}

// idlePollSuffix marks a configuration measured with the machine's idle
// CPUs held polling (holdIdlePoll).
const idlePollSuffix = ", idle CPUs polling"

func latencySettingsFromEnv(t *testing.T) latencySettings {
	s := latencySettings{duration: 10 * time.Second, connections: envInt("LATENCY_CONNECTIONS", 4), rounds: envInt("LATENCY_ROUNDS", 2),
		payloads: []int{64, 4096}, rates: []int{1000, 0}, idlePoll: []bool{false}}
	switch v := os.Getenv("LATENCY_IDLE_POLL"); v {
	case "", "0":
	case "1":
		s.idlePoll = []bool{true}
	case "both":
		s.idlePoll = []bool{false, true}
	default:
		t.Fatalf("LATENCY_IDLE_POLL: 0, 1 or both, not %q", v)
	}
	if v := os.Getenv("LATENCY_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		framework.Must(t, "LATENCY_DURATION", err)
		s.duration = d
	}
	return s
}

// TestLatency: fortio v1.67.1 in a client pod against fortio's echo
// server in a server pod through a ClusterIP Service, as Kmesh measures
// its data plane: a POST of 64 B and of 4 KiB, echoed back, at 1,000 qps
// and at the maximum (-qps 0), over LATENCY_CONNECTIONS (4) connections
// for LATENCY_DURATION (10 s) each, LATENCY_ROUNDS (2) rounds in
// alternating order. The client on the server's node, and with two nodes
// or more also on another node. On a fresh cluster per network
// (LATENCY_LEGS, "meshwire istio-cni"): on meshwire's, no mesh, REDIRECT
// with the sidecar (the agent without --fastpath), the same with the
// fast path, EBPF with the fast path, and ambient with the ztunnel
// stand-in; on istio-cni's, no mesh and istio-cni's REDIRECT with the
// same sidecar. Reported: p50, p90, p99, the qps reached, and the CPU of
// the nodes' pods (and of the machine) per 1,000 requests. Judged: every
// request answered, 1,000 qps reached, each request through the sidecar
// or the stand-in where there is one, the fast path attached where it
// should be and, with a sidecar, carrying messages on the client's node
// and on the server's for each placement (checkPlacement), and
// latencyCut on meshwire's cluster.
func TestLatency(t *testing.T) {
	repo, err := filepath.Abs("../..")
	framework.Must(t, "the repository", err)
	life := framework.Lifecycle{Repo: repo, Nodes: clusterNodes(), Logs: reportDir("latency", "lifecycle")}
	nets := legs("LATENCY_LEGS", "meshwire", "istio-cni")
	framework.Require(t, "a network to run on (LATENCY_LEGS)", checkf(len(nets) > 0, "LATENCY_LEGS names none"))
	s := latencySettingsFromEnv(t)
	var loads []latencyLoad
	for _, cni := range nets {
		c := clusterOf(t, life, cni)
		loads = append(loads, latencyLeg(t, c, s)...)
		b, _ := json.MarshalIndent(loads, "", "  ")
		_ = os.WriteFile(reportDir("latency", "loads.json"), b, 0o644)
		framework.Check(t, cni+": cluster down, its leak checks passed", life.Down(cni))
	}

	var text strings.Builder
	fmt.Fprintf(&text, "fortio v1.67.1 load -c %d -t %s -payload-size 64|4096 -qps 1000|0 POST http://CLUSTER-IP:8080/echo (the body echoed back), %s, %d node(s), %d round(s), legs %s\n\n",
		s.connections, s.duration, time.Now().UTC().Format("2006-01-02"), clusterNodes(), s.rounds, strings.Join(nets, ", "))
	lo, hi := -1.0, -1.0
	for _, l := range loads {
		if lo < 0 || l.Load1 < lo {
			lo = l.Load1
		}
		hi = max(hi, l.Load1)
	}
	fmt.Fprintf(&text, "the machine's 1-minute load average as each load began: %.2f to %.2f\n\n", lo, hi)
	text.WriteString(latencyTable(loads))
	cuts, cutErr := latencyCuts(loads)
	text.WriteString("\n" + cuts)
	_ = os.WriteFile(reportDir("latency", "summary.txt"), []byte(text.String()), 0o644)
	t.Log("\n" + text.String())
	if slices.Contains(nets, "meshwire") {
		framework.Check(t, fmt.Sprintf("the fast path takes at least %.0f %% off the sidecar's added p50 at 1,000 qps, same node", latencyCut*100), cutErr)
	}
}

// latencyLeg measures every configuration of the running cluster's
// network.
func latencyLeg(t *testing.T, c *framework.Cluster, s latencySettings) []latencyLoad {
	ctx := context.Background()
	framework.Require(t, "fortio's image on the nodes (make cluster FORTIO=1; make cluster-latency sets it)",
		checkf(c.Fortio, "the cluster was started without MESHWIRE_CLUSTER_FORTIO=1"))
	groups := latencyGroups(c.CNI)
	if c.CNI != "meshwire" && c.CNI != "istio-cni" {
		t.Fatalf("the cluster's network is %s: this suite runs on meshwire and istio-cni", c.CNI)
	}
	server, other := c.Placement()
	placements := map[string]string{"same node": server}
	if other != server {
		placements["other node"] = other
	}
	var namespaces []string
	ambient := false
	for _, g := range groups {
		for _, cfg := range g {
			if !slices.Contains(namespaces, cfg.NS) {
				namespaces = append(namespaces, cfg.NS)
			}
			ambient = ambient || cfg.Ambient
		}
	}
	// An earlier run's, left on a cluster kept after a failure.
	for _, ns := range append(slices.Clone(namespaces), ztNS) {
		framework.Require(t, "no namespace "+ns+" left from an earlier run", c.DeleteNamespace(ctx, ns, 2*time.Minute))
	}
	if ambient {
		// Ambient mode on and the stand-in connected before the
		// ambient namespace's pods start: they are enrolled at their ADD.
		setAmbient(t, ctx, c, true)
		apply(t, ctx, c, "ambient-ztunnel.yaml", nil)
		for _, n := range c.Nodes {
			framework.Require(t, "the stand-in on "+n.Name+" connected to its agent", framework.Poll(2*time.Minute,
				framework.MetricIs(ctx, n, "meshwire_ambient_ztunnels_connected", 1)))
		}
	}

	// The pods, every configuration's at once.
	for _, ns := range namespaces {
		var cfg latencyConfig
		for _, g := range groups {
			for _, x := range g {
				if x.NS == ns {
					cfg = x
				}
			}
		}
		nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		if cfg.Ambient {
			nsObj.Labels = map[string]string{ambLabel: "ambient"}
		}
		_, err := c.Client.CoreV1().Namespaces().Create(ctx, nsObj, metav1.CreateOptions{})
		framework.Require(t, "namespace "+ns, err)
		latencyPod(t, ctx, c, cfg, "server", server)
		for p, node := range placements {
			latencyPod(t, ctx, c, cfg, clientName(p), node)
		}
		_, err = c.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "server", Namespace: ns},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "server"},
				Ports: []corev1.ServicePort{{Name: "http-echo", Port: 8080, TargetPort: intstr.FromInt32(8080)}}},
		}, metav1.CreateOptions{})
		framework.Require(t, "Service "+ns+"/server", err)
	}
	for _, ns := range namespaces {
		pods := []string{"server"}
		for p := range placements {
			pods = append(pods, clientName(p))
		}
		for _, p := range pods {
			framework.Require(t, ns+"/"+p+" Ready", framework.Poll(2*time.Minute, podReady(ctx, c, ns, p)))
		}
	}
	if ambient {
		// Enrolled at their ADD: the server and its node's client, the
		// other node's client.
		for _, n := range c.Nodes {
			want := map[bool]float64{true: 2, false: 1}[n.Name == server]
			framework.Require(t, fmt.Sprintf("%s: the ambient namespace's %.0f pods enrolled", n.Name, want), framework.Poll(time.Minute,
				framework.MetricIs(ctx, n, "meshwire_ambient_enrolled_pods", want)))
		}
	}

	l := &latLeg{t: t, ctx: ctx, c: c, s: s, placements: placements, serverNode: server}
	var out []latencyLoad
	for r := 0; r < s.rounds; r++ {
		order := slices.Clone(groups)
		if r%2 == 1 {
			slices.Reverse(order)
			for i := range order {
				order[i] = slices.Clone(order[i])
				slices.Reverse(order[i])
			}
		}
		for _, g := range order {
			what := fmt.Sprintf("round %d, %s", r+1, c.CNI)
			if c.CNI == "meshwire" {
				setFastpath(t, ctx, c, g[0].Fastpath)
				what += map[bool]string{true: ", fast path attached", false: ", fast path detached"}[g[0].Fastpath]
			}
			l.measureIdle(what)
			for _, cfg := range g {
				out = append(out, l.config(cfg, r+1)...)
			}
		}
	}
	// As up installed it, before the cluster goes down: its leak checks
	// judge the agent's own clean-up.
	for _, ns := range append(slices.Clone(namespaces), ztNS) {
		framework.Check(t, "namespace "+ns+" deleted", c.DeleteNamespace(ctx, ns, 2*time.Minute))
	}
	if c.CNI == "meshwire" {
		setAmbient(t, ctx, c, false)
		setFastpath(t, ctx, c, true)
	}
	return out
}

func clientName(placement string) string {
	if placement == "same node" {
		return "client"
	}
	return "client-other"
}

// latencyPod creates pod name of cfg on node from manifests/latency.yaml:
// the sidecar's shape, or without the sidecar.
func latencyPod(t *testing.T, ctx context.Context, c *framework.Cluster, cfg latencyConfig, name, node string) {
	mode := cfg.Sidecar
	if mode == "" {
		mode = "REDIRECT"
	}
	b, err := c.Manifest("latency.yaml", map[string]string{"MESHWIRE_MODE": mode})
	framework.Must(t, "render latency.yaml", err)
	p, err := framework.DecodePod(b)
	framework.Must(t, "decode latency.yaml", err)
	p.Name, p.Namespace = name, cfg.NS
	p.Labels["app"] = name
	p.Labels["service.istio.io/canonical-name"] = name
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	if cfg.Sidecar == "" {
		p.Spec.Containers = slices.DeleteFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == "istio-proxy" })
		for k := range p.Annotations {
			if strings.HasPrefix(k, "sidecar.istio.io/") || strings.HasPrefix(k, "intercept.meshwire.io/") {
				delete(p.Annotations, k)
			}
		}
		delete(p.Labels, "security.istio.io/tlsMode")
	}
	_, err = c.Client.CoreV1().Pods(cfg.NS).Create(ctx, p, metav1.CreateOptions{})
	framework.Require(t, "pod "+cfg.NS+"/"+name, err)
}

type latLeg struct {
	t          *testing.T
	ctx        context.Context
	c          *framework.Cluster
	s          latencySettings
	placements map[string]string
	serverNode string
	idle       float64 // the pods' CPU seconds per second with no load, as now set up
}

// measureIdle samples the pods' CPU over the load's duration with no
// load: what the pods (the agent, CoreDNS, the sidecars' and fortio's
// idle work) spend whatever the requests.
func (l *latLeg) measureIdle(what string) {
	before, err := l.podsCPU()
	framework.Must(l.t, "the pods' CPU", err)
	t0 := time.Now()
	time.Sleep(l.s.duration)
	after, err := l.podsCPU()
	framework.Must(l.t, "the pods' CPU", err)
	l.idle = framework.PodsCPUDelta(before, after) / time.Since(t0).Seconds()
	l.t.Logf("%s: with no load the pods spent %.1f ms of CPU per second", what, l.idle*1e3)
}

// config measures one configuration: per placement, a warm-up, then the
// loads; and checks the path its requests took.
func (l *latLeg) config(cfg latencyConfig, round int) []latencyLoad {
	t, ctx, c := l.t, l.ctx, l.c
	svc, err := c.Client.CoreV1().Services(cfg.NS).Get(ctx, "server", metav1.GetOptions{})
	framework.Require(t, "Service "+cfg.NS+"/server", err)
	url := "http://" + svc.Spec.ClusterIP + ":8080/echo"
	name := fmt.Sprintf("round %d, %s", round, cfg.Name)
	if cfg.Ambient {
		for _, n := range c.Nodes {
			framework.Require(t, name+": the stand-in on "+n.Name+" connected", framework.Poll(2*time.Minute,
				framework.MetricIs(ctx, n, "meshwire_ambient_ztunnels_connected", 1)))
		}
	}
	paths := l.pathCounts(cfg)
	fp := l.fastpathCounts()
	var out []latencyLoad
	var requests int64
	placements := []string{"same node", "other node"}
	if round%2 == 0 {
		slices.Reverse(placements)
	}
	for _, p := range placements {
		if _, ok := l.placements[p]; !ok {
			continue
		}
		client := clientName(p)
		// A warm-up: the Service's rules, the connections, the caches.
		framework.Require(t, name+", "+p+": warm-up answered", framework.Poll(time.Minute, func() error {
			r, err := l.fortio(cfg.NS, client, url, 1000, 64, 2*time.Second)
			if err == nil && (r.Failed() > 0 || r.Requests() == 0) {
				err = fmt.Errorf("%d of %d requests failed: codes %v", r.Failed(), r.Requests(), r.RetCodes)
			}
			return err
		}))
		idlePoll := slices.Clone(l.s.idlePoll)
		if round%2 == 0 {
			slices.Reverse(idlePoll)
		}
		// The fast path's counters around this placement's loads (after
		// its warm-up), judged per node: checkPlacement.
		fpBefore, placed := l.fastpathCounts(), int64(0)
		for _, payload := range l.s.payloads {
			for _, qps := range l.s.rates {
				for _, poll := range idlePoll {
					ld, ok := l.load(cfg, round, p, url, payload, qps, poll)
					if !ok {
						continue
					}
					requests += ld.Requests
					placed += ld.Requests
					out = append(out, ld)
				}
			}
		}
		l.checkPlacement(cfg, name+", "+p, p, fpBefore, l.fastpathCounts(), placed)
	}
	l.checkPath(cfg, name, paths, fp, requests)
	return out
}

// load runs one `fortio load` of cfg's client at placement p (payload
// bytes at qps, the idle CPUs held polling with poll) and checks it:
// every request answered, the rate reached. false: fortio gave no result.
func (l *latLeg) load(cfg latencyConfig, round int, p, url string, payload, qps int, poll bool) (latencyLoad, bool) {
	t := l.t
	ld := latencyLoad{Network: l.c.CNI, Config: cfg.Name, Placement: p, Payload: payload, QPS: qps, Round: round}
	release := func() error { return nil }
	if poll {
		ld.Config += idlePollSuffix
		var err error
		release, err = holdIdlePoll()
		framework.Require(t, "the idle CPUs held polling (/dev/cpu_dma_latency)", err)
	}
	before, err := l.podsCPU()
	framework.Must(t, "the pods' CPU", err)
	ld.Load1 = loadAvg()
	m0, t0 := framework.SampleCPU()["machine"], time.Now()
	r, err := l.fortio(cfg.NS, clientName(p), url, qps, payload, l.s.duration)
	m1 := framework.SampleCPU()["machine"]
	ld.WallS, ld.IdlePodsCPU = time.Since(t0).Seconds(), l.idle
	after, err2 := l.podsCPU()
	framework.Must(t, "the pods' CPU", err2)
	framework.Must(t, "the idle CPUs' setting restored", release())
	what := fmt.Sprintf("round %d, %s, %s, %d B, %s", round, cfg.Name, p, payload, rateName(qps))
	if poll {
		what += idlePollSuffix
	}
	if !framework.Check(t, what+": fortio's result", err) {
		return ld, false
	}
	ld.PodsCPU, ld.MachineCPU = framework.PodsCPUDelta(before, after), m1-m0
	ld.ActualQPS, ld.Requests, ld.Failed = r.ActualQPS, r.Requests(), r.Failed()
	for _, x := range []struct {
		p float64
		v *float64
	}{{50, &ld.P50US}, {90, &ld.P90US}, {99, &ld.P99US}} {
		v, ok := r.Percentile(x.p)
		framework.Checkf(t, fmt.Sprintf("%s: fortio reported p%.0f", what, x.p), ok, "not in its result")
		*x.v = v * 1e6
	}
	t.Logf("%s: p50 %.0f µs, p90 %.0f µs, p99 %.0f µs, %.0f qps, %d requests, pods %.1f ms CPU per 1,000 (machine %.1f)",
		what, ld.P50US, ld.P90US, ld.P99US, ld.ActualQPS, ld.Requests, perK(ld.PodsCPU, ld.Requests), perK(ld.MachineCPU, ld.Requests))
	framework.Checkf(t, what+": every request answered 200", ld.Failed == 0 && ld.Requests > 0, "%d of %d failed: codes %v", ld.Failed, ld.Requests, r.RetCodes)
	if qps > 0 {
		framework.Checkf(t, fmt.Sprintf("%s: at least 95 %% of %d qps reached", what, qps), ld.ActualQPS >= 0.95*float64(qps), "%.0f qps", ld.ActualQPS)
	}
	return ld, true
}

// holdIdlePoll keeps the machine's idle CPUs polling instead of halting
// until release: a PM QoS request of 0 µs wake-up latency through
// /dev/cpu_dma_latency, held while its file stays open (as tuned's
// latency-performance profile does). On these VMs (cpuidle's haltpoll) an
// idle vCPU otherwise halts after a short poll, and waking it goes
// through the hypervisor: the loads with and without show what the
// wake-ups of idle CPUs cost a request. The setting ends with the
// process, whatever way it ends.
func holdIdlePoll() (release func() error, err error) {
	f, err := os.OpenFile("/dev/cpu_dma_latency", os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	if _, err := f.Write([]byte{0, 0, 0, 0}); err != nil { // an int32 of µs
		f.Close()
		return nil, err
	}
	return f.Close, nil
}

// loadAvg is the machine's 1-minute load average, -1 when unread.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

func rateName(qps int) string {
	if qps == 0 {
		return "max qps"
	}
	return strconv.Itoa(qps) + " qps"
}

func perK(sec float64, requests int64) float64 {
	if requests == 0 {
		return 0
	}
	return sec * 1e3 / float64(requests) * 1e3
}

// fortio runs `fortio load` in the client's app container: -qps qps (0:
// as fast as it goes) over the connections, a POST of payload bytes that
// fortio's echo handler sends back, durations resolved to 10 µs.
func (l *latLeg) fortio(ns, client, url string, qps, payload int, d time.Duration) (*framework.FortioResult, error) {
	ctx, cancel := context.WithTimeout(l.ctx, d+time.Minute)
	defer cancel()
	out, err := l.c.Exec(ctx, ns, client, "app", "/usr/bin/fortio", "load", "-qps", strconv.Itoa(qps), "-c", strconv.Itoa(l.s.connections),
		"-t", d.String(), "-payload-size", strconv.Itoa(payload), "-r", "0.00001", "-p", "50,90,99", "-json", "-", url)
	if err != nil {
		return nil, err
	}
	return framework.ParseFortio(out)
}

// podsCPU samples the CPU of every node's pods.
func (l *latLeg) podsCPU() (map[string]float64, error) {
	all := map[string]float64{}
	for _, n := range l.c.Nodes {
		m, err := framework.PodsCPU(n)
		if err != nil {
			return nil, err
		}
		for k, v := range m {
			all[k] = v
		}
	}
	return all, nil
}

// latPaths counts the connections the server's sidecar (or, in ambient
// mode, the stand-in on its node) took inbound, and each client's
// sidecar outbound.
type latPaths struct {
	inbound  int
	outbound map[string]int
}

func (l *latLeg) pathCounts(cfg latencyConfig) latPaths {
	p := latPaths{inbound: -1, outbound: map[string]int{}}
	isConn := func(listener string) func(proxylog.Record) bool {
		return func(r proxylog.Record) bool { return r.Event == "conn" && r.Listener == listener }
	}
	switch {
	case cfg.Sidecar != "":
		if out, err := l.c.Logs(l.ctx, cfg.NS, "server", "istio-proxy"); err == nil {
			p.inbound = countRecords(out, isConn("inbound"))
		}
		for pl := range l.placements {
			p.outbound[pl] = -1
			if out, err := l.c.Logs(l.ctx, cfg.NS, clientName(pl), "istio-proxy"); err == nil {
				p.outbound[pl] = countRecords(out, isConn("outbound"))
			}
		}
	case cfg.Ambient:
		srv, err := l.c.Client.CoreV1().Pods(cfg.NS).Get(l.ctx, "server", metav1.GetOptions{})
		if err != nil {
			return p
		}
		pods, err := l.c.Client.CoreV1().Pods(ztNS).List(l.ctx, metav1.ListOptions{LabelSelector: "app=ztunnel", FieldSelector: "spec.nodeName=" + l.serverNode})
		if err != nil {
			return p
		}
		p.inbound = 0
		for _, zt := range pods.Items {
			// A restarted stand-in has a new log: the count is of
			// the live ones.
			if out, err := l.c.Logs(l.ctx, ztNS, zt.Name, "ztunnel"); err == nil {
				p.inbound += max(0, countRecords(out, func(r proxylog.Record) bool {
					return r.Event == "conn" && r.Listener == "inbound" && r.Workload == string(srv.UID)
				}))
			}
		}
	}
	return p
}

// fastpathCounts is what the fast path carried so far, per node where it
// is attached (framework.FastpathCounts); none off meshwire's cluster.
func (l *latLeg) fastpathCounts() map[string]framework.FastpathCount {
	if l.c.CNI != "meshwire" {
		return nil
	}
	return framework.FastpathCounts(l.ctx, l.c.Nodes)
}

// attachedEverywhere: counts has every node's (the fast path attached on
// each).
func (l *latLeg) attachedEverywhere(counts map[string]framework.FastpathCount) bool {
	return len(counts) == len(l.c.Nodes)
}

// checkPlacement: with a sidecar and the fast path, the fast path on the
// client's node and on the server's carried at least a message per
// request of the placement's loads. Each node has app <-> sidecar hops of
// every request (across nodes, only the sidecar-to-sidecar hop goes over
// the network), so that a node whose fast path takes none of them fails
// here, which a sum over the nodes would hide.
func (l *latLeg) checkPlacement(cfg latencyConfig, what, placement string, before, after map[string]framework.FastpathCount, requests int64) {
	if l.c.CNI != "meshwire" || !cfg.Fastpath || cfg.Sidecar == "" || requests == 0 {
		return
	}
	nodes := []string{l.placements[placement], l.serverNode}
	var per []string
	for _, n := range l.c.Nodes {
		per = append(per, fmt.Sprintf("%s %.2f", n.Name, (after[n.Name].Messages-before[n.Name].Messages)/float64(requests)))
	}
	l.t.Logf("%s: the fast path carried messages per request: %s", what, strings.Join(per, ", "))
	framework.Check(l.t, what+": the fast path on the client's node and on the server's carried at least a message per request",
		framework.FastpathCarried(before, after, nodes, requests))
}

// checkPath: the requests went where the configuration sends them.
func (l *latLeg) checkPath(cfg latencyConfig, name string, before latPaths, fpBefore map[string]framework.FastpathCount, requests int64) {
	t := l.t
	after := l.pathCounts(cfg)
	switch {
	case cfg.Sidecar != "":
		framework.Checkf(t, name+": the server's sidecar took the connections inbound", before.inbound >= 0 && after.inbound > before.inbound,
			"%d inbound connections in its log before, %d after", before.inbound, after.inbound)
		for pl := range l.placements {
			framework.Checkf(t, name+": the "+pl+" client's sidecar took its connections outbound", before.outbound[pl] >= 0 && after.outbound[pl] > before.outbound[pl],
				"%d outbound connections in its log before, %d after", before.outbound[pl], after.outbound[pl])
		}
	case cfg.Ambient:
		framework.Checkf(t, name+": the stand-in took the server's connections inbound", before.inbound >= 0 && after.inbound > before.inbound,
			"%d inbound connections to the server in its log before, %d after", before.inbound, after.inbound)
	}
	if l.c.CNI != "meshwire" {
		return
	}
	fpAfter := l.fastpathCounts()
	if l.attachedEverywhere(fpBefore) && l.attachedEverywhere(fpAfter) && requests > 0 {
		var messages, peers float64
		for n, a := range fpAfter {
			messages += a.Messages - fpBefore[n].Messages
			peers += a.PeerPairs - fpBefore[n].PeerPairs
		}
		t.Logf("%s: the fast path carried %.1f messages per request, paired %.0f sidecar-to-sidecar connections", name,
			messages/float64(requests), peers)
	}
	// With a sidecar, what it carried is judged per placement
	// (checkPlacement).
	if !cfg.Fastpath {
		framework.Checkf(t, name+": the fast path detached on every node", len(fpBefore) == 0 && len(fpAfter) == 0,
			"attached on %d node(s) before, %d after", len(fpBefore), len(fpAfter))
	} else {
		framework.Checkf(t, name+": the fast path attached on every node", l.attachedEverywhere(fpBefore) && l.attachedEverywhere(fpAfter),
			"on %d node(s) before, %d after, of %d", len(fpBefore), len(fpAfter), len(l.c.Nodes))
	}
}

// setFastpath turns --fastpath on or off in meshwire's DaemonSet (the
// rest of its command as up installed it), rolled out on every node:
// the old agent detaches the fast path as it stops, the new one attaches
// it (and restores the meshed pods' policies) or leaves it detached.
func setFastpath(t *testing.T, ctx context.Context, c *framework.Cluster, on bool) {
	setAgentFlag(t, ctx, c, "--fastpath", on)
	for _, n := range c.Nodes {
		framework.Require(t, fmt.Sprintf("the fast path attached %v on %s", on, n.Name), framework.Poll(time.Minute,
			framework.MetricIs(ctx, n, "meshwire_fastpath_attached", map[bool]float64{true: 1, false: 0}[on])))
	}
}

// latencyTable is every configuration's figures, the median over the
// rounds (each round's own in the loads' JSON).
func latencyTable(loads []latencyLoad) string {
	var keys []string
	by := map[string][]latencyLoad{}
	for _, l := range loads {
		k := l.key()
		if _, ok := by[k]; !ok {
			keys = append(keys, k)
		}
		by[k] = append(by[k], l)
	}
	// Placement, then payload, then rate, then the networks and their
	// configurations as latencyOrder lists them.
	order := func(l latencyLoad) []int {
		pl := 0
		if l.Placement != "same node" {
			pl = 1
		}
		cfg, poll := strings.CutSuffix(l.Config, idlePollSuffix)
		i := slices.IndexFunc(latencyOrder, func(c [2]string) bool { return c[0] == l.Network && c[1] == cfg })
		return []int{pl, l.Payload, -l.QPS, map[bool]int{false: 0, true: 1}[poll], i}
	}
	slices.SortStableFunc(keys, func(a, b string) int { return slices.Compare(order(by[a][0]), order(by[b][0])) })
	var b strings.Builder
	b.WriteString("| placement | payload | rate | network | configuration | p50 µs | p90 µs | p99 µs | qps | pods' CPU ms / 1,000 req | the same above idle | machine CPU ms / 1,000 req | rounds |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, k := range keys {
		ls := by[k]
		f := func(get func(latencyLoad) float64) float64 {
			var xs []float64
			for _, l := range ls {
				xs = append(xs, get(l))
			}
			return median(xs)
		}
		l := ls[0]
		fmt.Fprintf(&b, "| %s | %d B | %s | %s | %s | %.0f | %.0f | %.0f | %.0f | %.1f | %.1f | %.1f | %d |\n", l.Placement, l.Payload, rateName(l.QPS), l.Network, l.Config,
			f(func(l latencyLoad) float64 { return l.P50US }), f(func(l latencyLoad) float64 { return l.P90US }), f(func(l latencyLoad) float64 { return l.P99US }),
			f(func(l latencyLoad) float64 { return l.ActualQPS }),
			f(func(l latencyLoad) float64 { return perK(l.PodsCPU, l.Requests) }),
			f(func(l latencyLoad) float64 { return perK(l.PodsCPU-l.IdlePodsCPU*l.WallS, l.Requests) }),
			f(func(l latencyLoad) float64 { return perK(l.MachineCPU, l.Requests) }), len(ls))
	}
	return b.String()
}

// latencyCuts judges latencyCut: per payload, at 1,000 qps, same node,
// on meshwire's cluster, the sidecar's added p50 with the fast path
// against without (medians over the rounds, and each round's own).
func latencyCuts(loads []latencyLoad) (string, error) {
	text, err := latencyCutsOf(loads, "")
	for _, l := range loads {
		if strings.HasSuffix(l.Config, idlePollSuffix) {
			polled, _ := latencyCutsOf(loads, idlePollSuffix) // not judged: a setting of the machine's
			text += "\nThe same with the idle CPUs held polling (not judged):\n\n" + polled
			break
		}
	}
	return text, err
}

// latencyCutsOf is latencyCuts over the configurations named with suffix.
func latencyCutsOf(loads []latencyLoad, suffix string) (string, error) {
	p50 := func(cfg string, payload, round int) float64 {
		cfg += suffix
		var xs []float64
		for _, l := range loads {
			if l.Network == "meshwire" && l.Config == cfg && l.Placement == "same node" && l.Payload == payload && l.QPS == 1000 && (round == 0 || l.Round == round) {
				xs = append(xs, l.P50US)
			}
		}
		if len(xs) == 0 {
			return -1
		}
		return median(xs)
	}
	rounds := 0
	for _, l := range loads {
		rounds = max(rounds, l.Round)
	}
	var b strings.Builder
	var misses []string
	b.WriteString("| 1,000 qps, same node | no mesh p50 µs | sidecar adds µs | with the fast path it adds µs | cut | each round's cut | target |\n|---|---|---|---|---|---|---|\n")
	for _, payload := range []int{64, 4096} {
		base, side, fp := p50(latPlain.Name, payload, 0), p50(latRedirect.Name, payload, 0), p50(latRedirectFP.Name, payload, 0)
		if base < 0 || side < 0 || fp < 0 {
			misses = append(misses, fmt.Sprintf("%d B: not measured", payload))
			continue
		}
		cut := 1 - (fp-base)/(side-base)
		var each []string
		for r := 1; r <= rounds; r++ {
			rb, rs, rf := p50(latPlain.Name, payload, r), p50(latRedirect.Name, payload, r), p50(latRedirectFP.Name, payload, r)
			each = append(each, fmt.Sprintf("%.0f %%", 100*(1-(rf-rb)/(rs-rb))))
		}
		verdict := "met"
		if !(side > base) || cut < latencyCut {
			verdict = "NOT MET"
			misses = append(misses, fmt.Sprintf("%d B: %.0f %% (the sidecar adds %.0f µs, with the fast path %.0f µs)", payload, 100*cut, side-base, fp-base))
		}
		fmt.Fprintf(&b, "| %d B | %.0f | %.0f | %.0f | %.0f %% | %s | ≥ %.0f %%: %s |\n", payload, base, side-base, fp-base, 100*cut, strings.Join(each, ", "), latencyCut*100, verdict)
	}
	if len(misses) > 0 {
		return b.String(), fmt.Errorf("%s", strings.Join(misses, "; "))
	}
	return b.String(), nil
}

// median of xs: the mean of the middle two for an even count.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}
