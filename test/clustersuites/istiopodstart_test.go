//go:build cluster

package clustersuites

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

// The targets of issue 47 against istio-cni, the program meshwire's
// intercept replaces: a sidecar pod starts no slower on meshwire, and
// meshwire's chained plugin takes at most 0.3x of istio-cni's own ADD
// time. A miss is a finding: the suite fails and says by how much.
var (
	istioPodStartTargets = []framework.PodStartTarget{{Percentile: 50, Max: 1.0}, {Percentile: 99, Max: 1.0}}
	istioAddTargets      = []framework.PodStartTarget{{Percentile: 50, Max: 0.3}, {Percentile: 99, Max: 0.3}}
)

// meshwirePrograms are the user agents meshwire's binaries would call the
// API server with (client-go's default agent names the binary): its
// plugins, which have no Kubernetes client, and its node agent, which
// has one in ambient mode only (user agent meshwire/..., service account
// meshwire-node).
var meshwirePrograms = map[string]bool{"intercept": true, "bridge": true, "host-local": true, "portmap": true,
	"bandwidth": true, "loopback": true, "veth": true, "meshwire": true, "iptables-init": true}

// meshwireCaller: a request of meshwire's plugins or node agent.
func meshwireCaller(k framework.AuditKey) bool {
	return meshwirePrograms[k.Program] || k.User == "system:serviceaccount:kube-system:meshwire-node"
}

// istioPluginCaller: a request of istio-cni's CNI plugin (the binary
// istio-cni on the node, with the kubeconfig its agent writes for it),
// not of its agent (install-cni, the same service account).
func istioPluginCaller(k framework.AuditKey) bool { return k.Program == "istio-cni" }

// istioLeg is what one fresh cluster measured.
type istioLeg struct {
	Name     string                   `json:"name"`
	CNI      string                   `json:"cni"`
	PodStart framework.PodStartResult `json:"podStart"`
	// AddMS is the chained plugin's own ADD time of each pod, from its
	// log (by sandbox for meshwire, by pod for istio-cni).
	AddMS map[string]float64 `json:"addMs"`
	// Audit is the API server's requests in the pod-start windows.
	Audit []auditRow `json:"audit"`
	audit framework.AuditCounts
}

type auditRow struct {
	framework.AuditKey
	Requests int            `json:"requests"`
	Calls    map[string]int `json:"calls"`
}

// TestIstioPodStartCompare: sidecar pods (manifests/istio-podstart.yaml,
// REDIRECT) on fresh clusters in the order istio-cni, meshwire, meshwire,
// istio-cni (PODSTART_LEGS legs), MESHWIRE_CLUSTER_NODES nodes, each taken
// down with its leak checks. On each: PODSTART_PODS pods (30) created at
// once, PODSTART_ROUNDS rounds (3), create to Ready; the chained plugin's
// own ADD time of each pod, from its log on the node (meshwire's
// intercept: its "done" record's durationMs; istio-cni: from its "Start"
// to its "End iptables configuration" line); and the API server's
// requests while the pods started (its audit log), by user agent. Judged:
// pod start at most 1.0x of istio-cni's at p50 and p99, the plugin's ADD
// at most 0.3x, meshwire's plugins and agent making no API request, and,
// on each leg, every pod's ADD found in its plugin's log (the plugin acted
// on every pod). The report: istio-podstart/ under the report directory.
func TestIstioPodStartCompare(t *testing.T) {
	order := []string{"istio-cni", "meshwire", "meshwire", "istio-cni"}
	start := map[string]framework.PodStartResult{}
	adds := map[string][]float64{}
	audits := map[string]framework.AuditCounts{}
	var medians []string
	legs := alternateLegs(t, "istio-podstart", order, func(name, cni string, c *framework.Cluster) any {
		leg := istioPodStartLeg(t, c, name)
		start[cni] = start[cni].Add(leg.PodStart)
		adds[cni] = append(adds[cni], framework.Values(leg.AddMS)...)
		audits[cni] = audits[cni].Add(leg.audit)
		medians = append(medians, fmt.Sprintf("%s: pod start p50 %.0f ms, ADD p50 %.2f ms", name,
			framework.Percentile(leg.PodStart.StartMS, 50), framework.Percentile(framework.Values(leg.AddMS), 50)))
		return leg
	})

	podTable, podErr := framework.ComparePodStart("meshwire", start["meshwire"], "istio-cni", start["istio-cni"], istioPodStartTargets)
	addTable, addErr := framework.CompareTimes("the chained plugin's own ADD, from its log", "meshwire intercept", adds["meshwire"], "istio-cni", adds["istio-cni"], istioAddTargets)
	var text strings.Builder
	fmt.Fprintf(&text, "sidecar pods (REDIRECT), %s, %d node(s), %d legs (%s), %d pods at once\n\n%s\n%s\n",
		time.Now().UTC().Format("2006-01-02"), clusterNodes(), legs, strings.Join(order[:min(legs, len(order))], ", "),
		envInt("PODSTART_PODS", 30), podTable, addTable)
	for _, cni := range []string{"istio-cni", "meshwire"} {
		pods := len(start[cni].StartMS)
		fmt.Fprintf(&text, "API requests while the pods started, %s (audit log, requests received in the pod-start windows):\n\n%s\n",
			cni, framework.AuditTable(audits[cni], pods, func(k framework.AuditKey) bool {
				return cni == "meshwire" && meshwireCaller(k) || cni == "istio-cni" && istioPluginCaller(k)
			}))
	}
	fmt.Fprintf(&text, "each cluster: %s\n", strings.Join(medians, "; "))
	_ = os.WriteFile(reportDir("istio-podstart", "summary.txt"), []byte(text.String()), 0o644)
	t.Log("\n" + text.String())

	framework.Check(t, "pod start within its targets against istio-cni (p50 and p99 at most 1.0x)", podErr)
	framework.Check(t, "the chained plugin's own ADD within its targets against istio-cni (p50 and p99 at most 0.3x)", addErr)
	if n := len(start["meshwire"].StartMS); n > 0 {
		m := audits["meshwire"].Total(meshwireCaller)
		framework.Checkf(t, "meshwire's plugins and node agent: 0 API requests per pod ADD", m == 0,
			"%d requests for %d pods (%.2f per pod)", m, n, float64(m)/float64(n))
	}
}

// istioPodStartLeg runs the sidecar pods on the running cluster and reads
// what the plugin and the API server logged meanwhile.
func istioPodStartLeg(t *testing.T, c *framework.Cluster, name string) istioLeg {
	ctx := context.Background()
	pods, rounds := envInt("PODSTART_PODS", 30), envInt("PODSTART_ROUNDS", 3)
	leg := istioLeg{Name: name, CNI: c.CNI}
	b, err := c.Manifest("istio-podstart.yaml", nil)
	framework.Must(t, "render istio-podstart.yaml", err)
	tmpl, err := framework.DecodePod(b)
	framework.Must(t, "decode istio-podstart.yaml", err)
	t.Logf("%s: %d sidecar pods at once, %d rounds, on %s, %d node(s)", name, pods, rounds, c.CNI, len(c.Nodes))
	leg.PodStart, err = framework.PodStartOf(ctx, c.Client, pods, rounds, tmpl, t.Logf)
	framework.Require(t, name+": pod start measured", err)
	want := pods * rounds
	t.Logf("%s: %d pods, create to Ready p50 %.0f ms, p99 %.0f ms", name, len(leg.PodStart.StartMS),
		framework.Percentile(leg.PodStart.StartMS, 50), framework.Percentile(leg.PodStart.StartMS, 99))

	// The chained plugin's ADD of each pod, from its log on each node.
	leg.AddMS = map[string]float64{}
	for _, n := range c.Nodes {
		var got map[string]float64
		switch c.CNI {
		case "meshwire":
			f, err := os.Open(n.PluginLog)
			if !framework.Check(t, name+": meshwire's plugin log of "+n.Name, err) {
				continue
			}
			got, err = framework.InterceptAddTimes(f, leg.PodStart.Windows)
			f.Close()
			framework.Check(t, name+": read "+n.PluginLog, err)
		case "istio-cni":
			// istio-cni's plugin tees its log to the node's
			// /var/run/istio-cni/istio-cni.log (and to its agent's
			// output over a socket): read on the node.
			out, err := n.Command("cat", istioCNIPluginLog).Output()
			if !framework.Check(t, name+": istio-cni's plugin log "+istioCNIPluginLog+" on "+n.Name, err) {
				continue
			}
			got, err = framework.IstioCNIAddTimes(bytes.NewReader(out), leg.PodStart.Windows)
			framework.Check(t, name+": read istio-cni's plugin log on "+n.Name, err)
		default:
			t.Fatalf("%s: the cluster's network is %s: this suite compares istio-cni and meshwire", name, c.CNI)
		}
		for k, v := range got {
			leg.AddMS[k] = v
		}
	}
	framework.Checkf(t, fmt.Sprintf("%s: %s's ADD logged for each of the %d pods, rules installed", name, c.CNI, want),
		len(leg.AddMS) == want, "%d found", len(leg.AddMS))
	ms := framework.Values(leg.AddMS)
	t.Logf("%s: %s's own ADD, %d pods: p50 %.2f ms, p99 %.2f ms", name, c.CNI, len(ms), framework.Percentile(ms, 50), framework.Percentile(ms, 99))

	// The API server's requests in the pod-start windows.
	files, err := c.AuditLogs()
	if framework.Check(t, name+": the API server's audit log", err) {
		leg.audit, err = framework.CountAuditFiles(files, leg.PodStart.Windows)
		framework.Check(t, name+": read the audit log", err)
		for k, v := range leg.audit.Requests {
			leg.Audit = append(leg.Audit, auditRow{AuditKey: k, Requests: v, Calls: leg.audit.Calls[k]})
		}
		t.Logf("%s: API requests while the pods started:\n%s", name, framework.AuditTable(leg.audit, len(leg.PodStart.StartMS), nil))
		if c.CNI == "istio-cni" {
			// The attribution holds: istio-cni's plugin GETs each pod.
			n := leg.audit.Total(istioPluginCaller)
			framework.Checkf(t, name+": istio-cni's plugin found in the audit log, at least a request per pod", n >= want, "%d requests for %d pods", n, want)
		}
	}
	return leg
}

// istioCNIPluginLog is where istio-cni's plugin tees its log on the node
// (its config's cni_agent_run_dir, the chart's /var/run/istio-cni, and
// istio's constants.LocalRollingLogName).
const istioCNIPluginLog = "/var/run/istio-cni/istio-cni.log"
