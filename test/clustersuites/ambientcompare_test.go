//go:build cluster

package clustersuites

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshwire/meshwire/internal/proxylog"
	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

const (
	ambCmpNS       = "mwk-ambcmp"
	ambCmpClientNS = "mwk-ambcmp-client"
	ambCmpPods     = 20
	ambCmpSuite    = "ambient-compare"
)

// ambientAgents: where each network's node agent runs (namespace, label
// selector of its pods).
var ambientAgents = map[string][2]string{
	"meshwire":  {"kube-system", "app.kubernetes.io/name=meshwire"},
	"istio-cni": {"istio-system", "app.kubernetes.io/name=istio-cni"},
}

// meshwireAmbientFlags configure meshwire's agent as istio-cni's chart's
// ambient profile configures istio-cni (AMBIENT_DNS_CAPTURE and
// AMBIENT_IPV6 true): DNS capture on, the IPv6 rules too.
var meshwireAmbientFlags = []string{"--ambient-dns-capture", "--ambient-ipv6"}

// AmbientCompareResult is what one network's node agent did, as the
// report keeps it.
type AmbientCompareResult struct {
	Network string `json:"network"`
	Pods    int    `json:"pods"`
	// EnrollMS: each running pod, from the namespace's label to its
	// AddWorkload in the stand-in's log.
	EnrollMS []float64 `json:"enrollMs"`
	// The agent's pod deleted while the client called the enrolled pods:
	// the requests answered and failed, the failures, the stand-in's
	// inbound connections meanwhile, and the time from the deletion to the
	// new agent's snapshot in the stand-in's log.
	RestartOK       int      `json:"restartOk"`
	RestartFailed   int      `json:"restartFailed"`
	RestartFailures []string `json:"restartFailures,omitempty"`
	RestartInbound  int      `json:"restartInbound"`
	RestartGapMS    float64  `json:"restartGapMs"`
	// The pods created again in the labeled namespace: each one's create
	// to its AddWorkload, and those whose first connection (their init
	// container's) the stand-in logged after their AddWorkload.
	NewAddMS          []float64 `json:"newAddMs"`
	NewEnrolledFirst  int       `json:"newEnrolledFirst"`
	NewNotFirst       []string  `json:"newNotFirst,omitempty"`
	RunningRulesLines int       `json:"runningRulesLines"`
	NewRulesLines     int       `json:"newRulesLines"`
	// RulesVariants: the iptables variants that held the running pods'
	// rules (the agent's detection of the host's).
	RulesVariants []string `json:"rulesVariants"`
}

// TestAmbientCompare (one node, kubelet's pod cgroups): istio-cni's node
// agent in ambient mode and meshwire's agent with --ambient, each on a
// fresh cluster of its network (AMBCMP_LEGS, "istio-cni meshwire"), each
// serving the same ztunnel stand-in (test/proxy -zds) over ZDS. istio-cni's DaemonSet is
// rendered again from its chart with the ambient profile (cluster.sh
// istio-cni ambient); meshwire's gets --ambient and the profile's DNS
// capture and IPv6. On each:
//   - 20 running pods, their namespace labeled istio.io/dataplane-mode=
//     ambient: the time until each is in the stand-in's AddWorkload log;
//   - each pod's in-pod rules read from the node, stored under the report
//     directory (ambient-compare/NETWORK/), the same for every pod;
//   - the agent's pod deleted while a client calls every enrolled pod
//     through the stand-in: no request may fail;
//   - the 20 pods deleted and 20 created in the labeled namespace: each
//     must be enrolled (AddWorkload) before its first connection, which
//     the stand-in must log.
//
// Then the rules: the running pods' and the new pods' under meshwire =
// under istio-cni, whichever iptables variant each agent wrote them with
// (FoldVariants; the variants are reported). Both agents' figures are
// printed side by side.
func TestAmbientCompare(t *testing.T) {
	repo, err := filepath.Abs("../..")
	framework.Must(t, "the repository", err)
	// kubelet's pod cgroups: istio-cni's agent finds a running pod's
	// network namespace by the pod's uid in its processes' cgroups.
	life := framework.Lifecycle{Repo: repo, Nodes: 1, Logs: reportDir(ambCmpSuite, "lifecycle"), Env: []string{"MESHWIRE_CLUSTER_POD_CGROUPS=1"}}
	if c, ok := framework.Running(); ok && !c.PodCgroups {
		framework.Require(t, "the running cluster (no pod cgroups) taken down", life.Down("running"))
	}
	nets := legs("AMBCMP_LEGS", "istio-cni", "meshwire")
	framework.Require(t, "a network to run on (AMBCMP_LEGS)", checkf(len(nets) > 0, "AMBCMP_LEGS names none"))
	var results []AmbientCompareResult
	for _, cni := range nets {
		dir := reportDir(ambCmpSuite, cni)
		_ = os.RemoveAll(dir)
		framework.Must(t, "the report directory "+dir, os.MkdirAll(dir, 0o755))
		c := clusterOf(t, life, cni)
		framework.Require(t, cni+": kubelet makes pod cgroups", checkf(c.PodCgroups, "the cluster was started without MESHWIRE_CLUSTER_POD_CGROUPS=1"))
		res := ambientCompareLeg(t, c, dir)
		results = append(results, res)
		b, _ := json.MarshalIndent(res, "", "  ")
		_ = os.WriteFile(filepath.Join(dir, "result.json"), b, 0o644)
		framework.Check(t, cni+": cluster down, its leak checks passed", life.Down(cni))
	}
	table := ambientCompareTable(results)
	_ = os.WriteFile(reportDir(ambCmpSuite, "summary.txt"), []byte(table), 0o644)
	t.Log("\n" + table)

	// The rules, from the readings stored (AMBCMP_LEGS=meshwire compares
	// with istio-cni's from an earlier run).
	for _, kind := range []string{"running", "new"} {
		read := func(cni string) (string, error) {
			b, err := os.ReadFile(reportDir(ambCmpSuite, cni, kind+".rules"))
			folded, variants := framework.FoldVariants(framework.NormalizeRules(string(b)))
			t.Logf("%s: the %s pods' rules are in %q", cni, kind, variants)
			return folded, err
		}
		a, err := read("istio-cni")
		if err == nil {
			var b string
			if b, err = read("meshwire"); err == nil {
				err = framework.DiffRules("istio-cni/"+kind, a, "meshwire/"+kind, b)
			}
		}
		framework.Check(t, "the "+kind+" pods' rules: under meshwire's agent = under istio-cni's", err)
	}
}

// ambientCompareLeg runs the comparison on the running cluster, its
// readings into dir.
func ambientCompareLeg(t *testing.T, c *framework.Cluster, dir string) AmbientCompareResult {
	ctx := context.Background()
	res := AmbientCompareResult{Network: c.CNI, Pods: ambCmpPods}
	node := c.Nodes[0]
	fresh(t, ctx, c, ambCmpNS, ambCmpClientNS, ztNS)
	defer func() {
		for _, ns := range []string{ambCmpNS, ambCmpClientNS, ztNS} {
			framework.Check(t, c.CNI+": namespace "+ns+" deleted", c.DeleteNamespace(ctx, ns, 2*time.Minute))
		}
	}()

	t.Logf("%s: the node agent in ambient mode", c.CNI)
	switch c.CNI {
	case "meshwire":
		setAmbient(t, ctx, c, true, meshwireAmbientFlags...)
	case "istio-cni":
		framework.Require(t, "istio-cni's DaemonSet rendered with the ambient profile", c.IstioCNI("ambient"))
	default:
		t.Fatalf("no ambient agent on network %s", c.CNI)
	}
	apply(t, ctx, c, "ambient-ztunnel.yaml", nil)
	zt := &standIn{t: t, ctx: ctx, c: c, node: node.Name}
	framework.Require(t, c.CNI+": the stand-in connected and got the agent's snapshot",
		framework.Poll(2*time.Minute, func() error { return zt.atLeast(isEvent("snapshot"), 1) }))

	t.Logf("%s: %d pods and a client, not labeled", c.CNI, ambCmpPods)
	apply(t, ctx, c, "ambient-compare.yaml", map[string]string{"NODE": node.Name})
	for i := 0; i < ambCmpPods; i++ {
		apply(t, ctx, c, "ambient-compare-pod.yaml", map[string]string{"NAME": fmt.Sprintf("run-%02d", i), "NODE": node.Name})
	}
	pods, err := c.WaitReady(ctx, ambCmpNS, "app=ambcmp", ambCmpPods, 3*time.Minute)
	framework.Require(t, c.CNI+": the pods Ready", err)
	framework.Require(t, c.CNI+": the client Ready", framework.Poll(2*time.Minute, podReady(ctx, c, ambCmpClientNS, "client")))
	framework.Check(t, c.CNI+": not labeled: the stand-in got no pod", zt.none(isAdd("")))

	t.Logf("%s: label namespace %s %s=ambient", c.CNI, ambCmpNS, ambLabel)
	t0 := time.Now()
	labelAmbient(t, ctx, c, ambCmpNS, "ambient")
	var adds map[string]time.Time
	err = framework.Poll(2*time.Minute, func() error {
		adds = zt.firstTimes(isAdd(""))
		if missing := missingUIDs(pods, adds); len(missing) > 0 {
			return fmt.Errorf("%d pods not added: %s", len(missing), strings.Join(missing, ", "))
		}
		return nil
	})
	framework.Check(t, fmt.Sprintf("%s: every running pod enrolled (AddWorkload)", c.CNI), err)
	for _, p := range pods {
		if at, ok := adds[string(p.UID)]; ok {
			res.EnrollMS = append(res.EnrollMS, ms(at.Sub(t0)))
		}
	}
	t.Logf("%s: label to AddWorkload: p50 %.0f ms, last %.0f ms", c.CNI, framework.Percentile(res.EnrollMS, 50), framework.Percentile(res.EnrollMS, 100))

	res.RunningRulesLines = storeRules(t, ctx, c, pods, filepath.Join(dir, "running.rules"))
	if b, err := os.ReadFile(filepath.Join(dir, "running.rules")); err == nil {
		_, res.RulesVariants = framework.FoldVariants(string(b))
	}
	ambientRestart(t, ctx, c, zt, pods, &res)
	ambientRecreate(t, ctx, c, zt, pods, dir, &res)
	return res
}

// storeRules reads every pod's rules; they must be the same. The first
// pod's are stored in file; it returns their number of lines.
func storeRules(t *testing.T, ctx context.Context, c *framework.Cluster, pods []corev1.Pod, file string) int {
	var first, firstPod string
	for i := range pods {
		rules, err := c.PodRules(ctx, &pods[i])
		if !framework.Check(t, c.CNI+": "+pods[i].Name+"'s rules read from the node", err) {
			continue
		}
		if first == "" {
			first, firstPod = rules, pods[i].Name
			framework.Checkf(t, c.CNI+": "+firstPod+" has rules", rules != "", "its namespace has no rule")
			framework.Must(t, "store "+file, os.WriteFile(file, []byte(rules), 0o644))
			continue
		}
		framework.Check(t, c.CNI+": "+pods[i].Name+"'s rules = "+firstPod+"'s", framework.DiffRules(firstPod, first, pods[i].Name, rules))
	}
	return strings.Count(first, "\n")
}

// ambientRestart deletes the agent's pod on the node while the client
// calls every enrolled pod, until the new agent has sent its snapshot to
// the stand-in and 5 s after.
func ambientRestart(t *testing.T, ctx context.Context, c *framework.Cluster, zt *standIn, pods []corev1.Pod, res *AmbientCompareResult) {
	agent := ambientAgents[c.CNI]
	old, err := podOn(ctx, c, agent[0], agent[1], zt.node)
	framework.Require(t, c.CNI+": the agent's pod", err)
	var ips []string
	uids := map[string]bool{}
	for _, p := range pods {
		ips = append(ips, p.Status.PodIP)
		uids[string(p.UID)] = true
	}
	inbound := func(r proxylog.Record) bool { return r.Event == "conn" && r.Listener == "inbound" && uids[r.Workload] }
	snapshots, in0 := zt.count(isEvent("snapshot")), zt.count(inbound)

	t.Logf("%s: the client calls the %d pods; the agent's pod %s deleted", c.CNI, len(pods), old)
	type outcome struct {
		out string
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		out, err := c.Exec(ctx, ambCmpClientNS, "client", "client", "sh", "-c", callLoop, "sh", strings.Join(ips, " "))
		done <- outcome{out, err}
	}()
	time.Sleep(3 * time.Second)
	tDel := time.Now()
	framework.Must(t, "delete "+old, c.Client.CoreV1().Pods(agent[0]).Delete(ctx, old, metav1.DeleteOptions{}))
	var back time.Time
	err = framework.Poll(3*time.Minute, func() error {
		p, err := podOn(ctx, c, agent[0], agent[1], zt.node)
		if err != nil {
			return err
		}
		if p == old {
			return fmt.Errorf("%s not gone yet", old)
		}
		times := zt.times(isEvent("snapshot"))
		if len(times) <= snapshots {
			return fmt.Errorf("the stand-in has no snapshot from the new agent %s yet", p)
		}
		back = times[snapshots]
		return nil
	})
	framework.Check(t, c.CNI+": a new agent on the node, its snapshot in the stand-in's log", err)
	if !back.IsZero() {
		res.RestartGapMS = ms(back.Sub(tDel))
	}
	time.Sleep(5 * time.Second)
	_, err = c.Exec(ctx, ambCmpClientNS, "client", "client", "touch", "/tmp/stop")
	framework.Must(t, "stop the client's calls", err)
	o := <-done
	framework.Require(t, c.CNI+": the client's calls ran", o.err)
	for _, l := range strings.Split(strings.TrimSpace(o.out), "\n") {
		if strings.HasPrefix(l, "failed: ") {
			res.RestartFailures = append(res.RestartFailures, strings.TrimPrefix(l, "failed: "))
		}
		fmt.Sscanf(l, "ok %d failed %d", &res.RestartOK, &res.RestartFailed)
	}
	res.RestartInbound = zt.count(inbound) - in0
	t.Logf("%s: during the agent's restart: %d requests answered, %d failed; the stand-in's inbound connections to the pods: %d; deleted to the new agent's snapshot: %.0f ms",
		c.CNI, res.RestartOK, res.RestartFailed, res.RestartInbound, res.RestartGapMS)
	framework.Checkf(t, c.CNI+": the agent restarted while the client called the enrolled pods: no request failed", res.RestartOK > 0 && res.RestartFailed == 0,
		"%d answered, %d failed: %s", res.RestartOK, res.RestartFailed, strings.Join(res.RestartFailures, "; "))
	framework.Checkf(t, c.CNI+": ... and the requests went through the stand-in", res.RestartInbound >= res.RestartOK && res.RestartOK > 0,
		"%d answered, %d inbound connections logged", res.RestartOK, res.RestartInbound)
}

// callLoop asks each address in $1 for /clientip on 8080, round after
// round, until /tmp/stop exists; it prints each failure and the counts.
const callLoop = `ok=0; failed=0; rm -f /tmp/stop
while [ ! -e /tmp/stop ]; do
	for ip in $1; do
		if timeout 5 wget -q -O /dev/null "http://$ip:8080/clientip"; then ok=$((ok + 1)); else failed=$((failed + 1)); echo "failed: $ip at $(date +%T)"; fi
	done
done
echo "ok $ok failed $failed"`

// ambientRecreate deletes the running pods and creates as many in the
// labeled namespace: each must be added to the stand-in before its first
// connection, which the stand-in must log.
func ambientRecreate(t *testing.T, ctx context.Context, c *framework.Cluster, zt *standIn, old []corev1.Pod, dir string, res *AmbientCompareResult) {
	t.Logf("%s: the %d pods deleted, %d created in the labeled namespace", c.CNI, len(old), len(old))
	for _, p := range old {
		framework.Must(t, "delete "+p.Name, c.Client.CoreV1().Pods(ambCmpNS).Delete(ctx, p.Name, metav1.DeleteOptions{}))
	}
	framework.Require(t, c.CNI+": the old pods gone", framework.Poll(2*time.Minute, func() error {
		ps, err := c.Pods(ctx, ambCmpNS, "app=ambcmp")
		if err == nil && len(ps) > 0 {
			err = fmt.Errorf("%d pods left", len(ps))
		}
		return err
	}))
	created := map[string]time.Time{}
	for i := range old {
		name := fmt.Sprintf("new-%02d", i)
		b, err := c.Manifest("ambient-compare-pod.yaml", map[string]string{"NAME": name, "NODE": zt.node})
		framework.Must(t, "render "+name, err)
		created[name] = time.Now()
		framework.Must(t, "create "+name, c.Apply(ctx, b))
	}
	pods, err := c.WaitReady(ctx, ambCmpNS, "app=ambcmp", len(old), 3*time.Minute)
	framework.Require(t, c.CNI+": the new pods Ready", err)
	adds := zt.firstTimes(isAdd(""))
	var late []string
	for _, p := range pods {
		uid := string(p.UID)
		add, added := adds[uid]
		first := zt.firstTimes(isConn("outbound", p.Status.PodIP, apiService+":443", uid))[uid]
		switch {
		case !added:
			late = append(late, p.Name+": never added")
			continue
		case first.IsZero():
			late = append(late, p.Name+": its first connection not through the stand-in")
		case first.Before(add):
			late = append(late, fmt.Sprintf("%s: its first connection %s before its AddWorkload", p.Name, add.Sub(first)))
		default:
			res.NewEnrolledFirst++
		}
		res.NewAddMS = append(res.NewAddMS, ms(add.Sub(created[p.Name])))
	}
	res.NewNotFirst = late
	t.Logf("%s: create to AddWorkload: p50 %.0f ms, p99 %.0f ms; enrolled before their first connection: %d of %d",
		c.CNI, framework.Percentile(res.NewAddMS, 50), framework.Percentile(res.NewAddMS, 99), res.NewEnrolledFirst, len(pods))
	framework.Checkf(t, c.CNI+": each new pod enrolled before its first connection, which went through the stand-in", len(late) == 0 && res.NewEnrolledFirst == len(old),
		"%d of %d: %s", res.NewEnrolledFirst, len(old), strings.Join(late, "; "))
	res.NewRulesLines = storeRules(t, ctx, c, pods, filepath.Join(dir, "new.rules"))
}

// ambientCompareTable prints the legs side by side.
func ambientCompareTable(results []AmbientCompareResult) string {
	var w strings.Builder
	fmt.Fprintf(&w, "ambient mode, agent against agent, one node, %s; the same ztunnel stand-in (test/proxy -zds)\n\n", time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&w, "%-52s", "")
	for _, r := range results {
		fmt.Fprintf(&w, " %22s", r.Network)
	}
	w.WriteString("\n")
	row := func(name string, f func(r AmbientCompareResult) string) {
		fmt.Fprintf(&w, "%-52s", name)
		for _, r := range results {
			fmt.Fprintf(&w, " %22s", f(r))
		}
		w.WriteString("\n")
	}
	row("running pods enrolled (of 20)", func(r AmbientCompareResult) string { return fmt.Sprint(len(r.EnrollMS)) })
	row("label -> AddWorkload, p50 (ms)", func(r AmbientCompareResult) string { return fmt.Sprintf("%.0f", framework.Percentile(r.EnrollMS, 50)) })
	row("label -> AddWorkload, last pod (ms)", func(r AmbientCompareResult) string { return fmt.Sprintf("%.0f", framework.Percentile(r.EnrollMS, 100)) })
	row("agent restart: requests answered / failed", func(r AmbientCompareResult) string { return fmt.Sprintf("%d / %d", r.RestartOK, r.RestartFailed) })
	row("agent restart: pod deleted -> new snapshot (ms)", func(r AmbientCompareResult) string { return fmt.Sprintf("%.0f", r.RestartGapMS) })
	row("new pods: create -> AddWorkload, p50 (ms)", func(r AmbientCompareResult) string { return fmt.Sprintf("%.0f", framework.Percentile(r.NewAddMS, 50)) })
	row("new pods: create -> AddWorkload, p99 (ms)", func(r AmbientCompareResult) string { return fmt.Sprintf("%.0f", framework.Percentile(r.NewAddMS, 99)) })
	row("new pods enrolled before their first connection", func(r AmbientCompareResult) string { return fmt.Sprintf("%d of %d", r.NewEnrolledFirst, r.Pods) })
	row("in-pod rules, lines (running / new)", func(r AmbientCompareResult) string {
		return fmt.Sprintf("%d / %d", r.RunningRulesLines, r.NewRulesLines)
	})
	row("in-pod rules, iptables variant", func(r AmbientCompareResult) string {
		var vs []string // legacy or nft, once each, from iptables-legacy-save etc.
		for _, v := range r.RulesVariants {
			_, v, _ = strings.Cut(strings.TrimSuffix(v, "-save"), "-")
			if !slices.Contains(vs, v) {
				vs = append(vs, v)
			}
		}
		return strings.Join(vs, " ")
	})
	return w.String()
}

// standIn reads the ztunnel stand-in's log on a node, with the times the
// runtime took its lines.
type standIn struct {
	t    *testing.T
	ctx  context.Context
	c    *framework.Cluster
	node string
}

type timedRecord struct {
	at time.Time
	proxylog.Record
}

// records is the stand-in's log; nil when it cannot be read or lacks its
// "ready" record.
func (z *standIn) records() []timedRecord {
	pod, err := podOn(z.ctx, z.c, ztNS, "app=ztunnel", z.node)
	if err != nil {
		return nil
	}
	lines, err := z.c.TimedLogs(z.ctx, ztNS, pod, "ztunnel")
	if err != nil {
		return nil
	}
	var out []timedRecord
	ready := false
	for _, l := range lines {
		var r proxylog.Record
		if json.Unmarshal([]byte(l.Text), &r) != nil {
			continue
		}
		ready = ready || r.Event == "ready"
		out = append(out, timedRecord{l.At, r})
	}
	if !ready {
		return nil
	}
	return out
}

// times is when each record that matches was logged; nil when the log
// cannot be read.
func (z *standIn) times(match func(proxylog.Record) bool) []time.Time {
	var out []time.Time
	for _, r := range z.records() {
		if match(r.Record) {
			out = append(out, r.at)
		}
	}
	return out
}

// count is how many records match, -1 when the log cannot be read.
func (z *standIn) count(match func(proxylog.Record) bool) int {
	recs := z.records()
	if recs == nil {
		return -1
	}
	n := 0
	for _, r := range recs {
		if match(r.Record) {
			n++
		}
	}
	return n
}

// firstTimes is, for each workload, when the first record that matches
// was logged.
func (z *standIn) firstTimes(match func(proxylog.Record) bool) map[string]time.Time {
	out := map[string]time.Time{}
	for _, r := range z.records() {
		if _, seen := out[r.Workload]; !seen && match(r.Record) {
			out[r.Workload] = r.at
		}
	}
	return out
}

func (z *standIn) atLeast(match func(proxylog.Record) bool, n int) error {
	if got := z.count(match); got < n {
		return fmt.Errorf("the stand-in logged %d such records (-1: no log), want %d", got, n)
	}
	return nil
}

func (z *standIn) none(match func(proxylog.Record) bool) error {
	if got := z.count(match); got != 0 {
		return fmt.Errorf("the stand-in logged %d such records (-1: no log)", got)
	}
	return nil
}

func isEvent(event string) func(proxylog.Record) bool {
	return func(r proxylog.Record) bool { return r.Event == event }
}

// missingUIDs is the pods (by name) whose uid times lacks, sorted.
func missingUIDs(pods []corev1.Pod, times map[string]time.Time) []string {
	var out []string
	for _, p := range pods {
		if _, ok := times[string(p.UID)]; !ok {
			out = append(out, p.Name)
		}
	}
	sort.Strings(out)
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
