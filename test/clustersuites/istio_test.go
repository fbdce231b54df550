//go:build cluster

package clustersuites

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshwire/meshwire/internal/proxylog"
	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

const istioRulesNS = "mwk-istio-rules"

// The pods TestIstioRules compares, by name: mesh.yaml's REDIRECT and
// TPROXY sidecar pods (no istio-init: the network's chained plugin sets
// their rules, istio-cni's or meshwire's intercept), and the init-container
// pods of istio-init.yaml (the rules set by the pod's own istio-init:
// meshwire's iptables-init, or Istio's pilot-agent istio-iptables).
var (
	sidecarModes = []string{"redirect", "tproxy"}
	// initRunners: who runs the pod's istio-init, and with what.
	initRunners = map[string]struct{ image, command string }{
		"meshwire": {"localhost/meshwire:latest", `["iptables-init"]`},
		"istio":    {"localhost/istio/proxyv2:meshwire-test", "null"},
	}
)

// istioInitArgs is istio-init's args for runner in mode, as a flow list:
// the injector's (framework.IstioInitArgs), pilot-agent's after its
// subcommand.
func istioInitArgs(runner, mode string) string {
	args := framework.IstioInitArgs(mode)
	if runner == "istio" {
		args = append([]string{"istio-iptables"}, args...)
	}
	b, _ := json.Marshal(args)
	return string(b)
}

// TestIstioRules: the same pods on a fresh istio-cni cluster and on a fresh
// meshwire cluster must be given the same rules. On each network: the
// REDIRECT and TPROXY sidecar pods of the mesh suite (their rules set by
// the chained plugin), and the init-container pods (istio-init run by
// meshwire's iptables-init and, where Istio's images are, by Istio's
// pilot-agent istio-iptables). Each pod's rules are read from its node
// (iptables-save of both variants and families, nft), normalized, and
// stored under the report directory (istio-rules/NETWORK/POD.rules), so
// that a later leg on another fresh cluster compares with them. Checked:
//   - istio-cni's sidecar rules = meshwire's intercept's, per mode;
//   - on one cluster, meshwire's iptables-init = Istio's istio-iptables, per
//     mode; and meshwire's iptables-init on the meshwire cluster = Istio's
//     istio-iptables on the istio-cni cluster;
//   - every pod Ready (the readiness probe on 15021 passes), no sidecar got
//     a connection for its status ports, and a request from another
//     compared pod reached each app through its sidecar (127.0.0.6).
func TestIstioRules(t *testing.T) {
	repo, err := filepath.Abs("../..")
	framework.Must(t, "the repository", err)
	nodes := clusterNodes()
	life := framework.Lifecycle{Repo: repo, Nodes: nodes, Logs: reportDir("istio-rules", "lifecycle")}
	restore := false
	if c, ok := framework.Running(); ok && c.CNI == "meshwire" && len(c.Nodes) == nodes {
		restore = true
	}
	// istio-cni first, whose readings the meshwire leg is compared with
	// (ISTIO_RULES_LEGS=meshwire compares a meshwire cluster with the
	// readings an earlier run stored).
	for _, cni := range legs("ISTIO_RULES_LEGS", "istio-cni", "meshwire") {
		c := clusterOf(t, life, cni)
		dir := reportDir("istio-rules", cni)
		_ = os.RemoveAll(dir)
		framework.Must(t, "the report directory "+dir, os.MkdirAll(dir, 0o755))
		readIstioRules(t, c, dir)
		framework.Check(t, cni+": cluster down, its leak checks passed", life.Down(cni))
	}
	compareIstioRules(t)
	if restore {
		framework.Check(t, "the meshwire cluster started again", life.Up("meshwire", "restore"))
	}
}

// readIstioRules runs the compared pods on the running cluster, stores
// each one's rules in dir, and checks them as the mesh suite does.
func readIstioRules(t *testing.T, c *framework.Cluster, dir string) {
	ctx := context.Background()
	fresh(t, ctx, c, istioRulesNS)
	node, _ := c.Placement()
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: istioRulesNS}}, metav1.CreateOptions{})
	framework.Require(t, c.CNI+": namespace "+istioRulesNS, err)
	defer func() {
		framework.Check(t, c.CNI+": namespace "+istioRulesNS+" deleted", c.DeleteNamespace(ctx, istioRulesNS, 2*time.Minute))
	}()
	names := []string{}
	for _, m := range sidecarModes {
		v := meshVars(m, "sidecar-"+m, node)
		v["NAMESPACE"] = istioRulesNS
		apply(t, ctx, c, "mesh.yaml", v)
		names = append(names, "sidecar-"+m)
	}
	// Istio's images are imported on the istio-cni network only
	// (lib/istio.sh): pilot-agent's pods run there.
	runners := []string{"meshwire"}
	if c.CNI == "istio-cni" {
		runners = append(runners, "istio")
	}
	for _, r := range runners {
		for _, m := range sidecarModes {
			name := "init-" + r + "-" + m
			v := meshVars(m, name, node)
			v["NAMESPACE"] = istioRulesNS
			v["INIT_IMAGE"], v["INIT_COMMAND"] = initRunners[r].image, initRunners[r].command
			v["INIT_ARGS"] = istioInitArgs(r, v["ISTIO_MODE"])
			apply(t, ctx, c, "istio-init.yaml", v)
			names = append(names, name)
		}
	}
	pods := map[string]*corev1.Pod{}
	for _, name := range names {
		ps, err := c.WaitReady(ctx, istioRulesNS, "app="+name, 1, 3*time.Minute)
		if !framework.Check(t, c.CNI+": "+name+" Ready (its probe on 15021 passes)", err) {
			continue
		}
		pods[name] = &ps[0]
	}
	logInitTimes(t, c.CNI, names, pods)
	for _, name := range names {
		p := pods[name]
		if p == nil {
			continue
		}
		rules, err := c.PodRules(ctx, p)
		if !framework.Check(t, fmt.Sprintf("%s: %s's rules read from %s", c.CNI, name, p.Spec.NodeName), err) {
			continue
		}
		framework.Checkf(t, c.CNI+": "+name+" has rules", rules != "", "its namespace has no rule")
		framework.Must(t, "store "+name+"'s rules", os.WriteFile(filepath.Join(dir, name+".rules"), []byte(rules), 0o644))
		if strings.HasPrefix(name, "init-") {
			out, err := c.Client.CoreV1().Pods(istioRulesNS).GetLogs(p.Name, &corev1.PodLogOptions{Container: "istio-init"}).DoRaw(ctx)
			if err == nil {
				_ = os.WriteFile(filepath.Join(dir, name+".istio-init.log"), out, 0o644)
			}
		}
	}
	// Through the sidecars: each app asked from the next compared pod's
	// app; the status ports never captured.
	var ready []string
	for _, name := range names {
		if pods[name] != nil {
			ready = append(ready, name)
		}
	}
	for i, name := range ready {
		from := pods[ready[(i+1)%len(ready)]]
		to := pods[name]
		if from == to {
			continue
		}
		out, err := c.Exec(ctx, istioRulesNS, from.Name, "app", "curl", "-sS", "-m", "10", "http://"+to.Status.PodIP+":8080/clientip")
		framework.Check(t, fmt.Sprintf("%s: %s -> %s: through %s's sidecar", c.CNI, from.Labels["app"], name, name), viaSidecar(strings.TrimSpace(out), err))
	}
	for _, name := range ready {
		log, err := c.Logs(ctx, istioRulesNS, pods[name].Name, "istio-proxy")
		n := -1
		if err == nil {
			n = countRecords(log, func(r proxylog.Record) bool {
				return r.Event == "conn" && (strings.HasSuffix(r.OrigDst, ":15020") || strings.HasSuffix(r.OrigDst, ":15021"))
			})
		}
		framework.Checkf(t, fmt.Sprintf("%s: %s's sidecar got no connection for its status ports", c.CNI, name), n == 0, "%s", statusPortFailure(n))
	}
}

// compareIstioRules compares the stored readings: the chained plugins'
// across the networks, and the init containers' on each network and
// across.
func compareIstioRules(t *testing.T) {
	// (Normalized again: a reading stored by an earlier run compares as
	// today's normalization reads it.)
	read := func(cni, name string) (string, error) {
		b, err := os.ReadFile(reportDir("istio-rules", cni, name+".rules"))
		return framework.NormalizeRules(string(b)), err
	}
	same := func(what, aNet, aPod, bNet, bPod string) {
		a, err := read(aNet, aPod)
		if err == nil {
			var b string
			if b, err = read(bNet, bPod); err == nil {
				err = framework.DiffRules(aNet+"/"+aPod, a, bNet+"/"+bPod, b)
			}
		}
		framework.Check(t, what, err)
	}
	for _, m := range sidecarModes {
		M := strings.ToUpper(m)
		same(M+": istio-cni's sidecar rules = meshwire's intercept's", "istio-cni", "sidecar-"+m, "meshwire", "sidecar-"+m)
		same(M+": on istio-cni's cluster, meshwire's iptables-init = Istio's istio-iptables", "istio-cni", "init-istio-"+m, "istio-cni", "init-meshwire-"+m)
		same(M+": meshwire's iptables-init on meshwire's cluster = Istio's istio-iptables on istio-cni's", "istio-cni", "init-istio-"+m, "meshwire", "init-meshwire-"+m)
		// A reference point, not a check: Istio's own two installers.
		a, errA := read("istio-cni", "init-istio-"+m)
		b, errB := read("istio-cni", "sidecar-"+m)
		if errA == nil && errB == nil {
			t.Logf("%s: Istio's istio-iptables and istio-cni (not judged): %v", M, framework.DiffRules("istio-iptables", a, "istio-cni", b))
		}
	}
	var files []string
	for _, cni := range []string{"istio-cni", "meshwire"} {
		m, _ := filepath.Glob(reportDir("istio-rules", cni, "*.rules"))
		files = append(files, m...)
	}
	sort.Strings(files)
	t.Logf("the readings: %s", strings.Join(files, " "))
}

// logInitTimes logs, for each pod with an istio-init, how long that init
// container ran and the pod's start (created to Ready), at the API's
// resolution of a second: meshwire's iptables-init beside Istio's
// istio-iptables.
func logInitTimes(t *testing.T, network string, names []string, pods map[string]*corev1.Pod) {
	for _, name := range names {
		p := pods[name]
		if p == nil || !strings.HasPrefix(name, "init-") {
			continue
		}
		run := "?"
		for _, s := range p.Status.InitContainerStatuses {
			if term := s.State.Terminated; s.Name == "istio-init" && term != nil {
				run = fmt.Sprintf("%.0f s", term.FinishedAt.Sub(term.StartedAt.Time).Seconds())
			}
		}
		start := "?"
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				start = fmt.Sprintf("%.0f s", cond.LastTransitionTime.Sub(p.CreationTimestamp.Time).Seconds())
			}
		}
		t.Logf("%s: %s: istio-init ran %s, the pod created to Ready %s (a second's resolution)", network, name, run, start)
	}
}
