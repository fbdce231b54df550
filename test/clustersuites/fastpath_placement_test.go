//go:build cluster

package clustersuites

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

// TestFastpathPlacement: TestLatency's pods for REDIRECT with the sidecar
// and the fast path (latency.yaml: fortio behind the test proxy), the
// server and a client on the first node, another client on the second,
// behind a ClusterIP Service; per placement, a fixed number of requests
// (`fortio load -qps 1000 -c 4 -n 2000`, twice each, alternating) with
// each node's fast-path counters read before and after. Judged as
// TestLatency judges a placement (framework.FastpathCarried): the fast
// path on the client's node and on the server's carried at least a
// message per request. Logged: every fast-path counter's change per node
// and load; written under reportDir("fastpath-placement"): each pod's
// cgroups and sockets (`ss -tanie` in its namespace) and each node's
// `meshwire fastpath status -o json` after each load. A quick look at
// the fast path across nodes (20 s) on a running cluster of two nodes
// or more with fortio's image (make cluster NODES=2 FORTIO=1):
//
//	MESHWIRE_CLUSTER_NODES=2 go test -tags cluster -count=1 -v -run '^TestFastpathPlacement$' ./test/clustersuites/
func TestFastpathPlacement(t *testing.T) {
	c := framework.Load(t)
	ctx := context.Background()
	framework.Require(t, "meshwire's cluster of 2 nodes or more with fortio's image",
		checkf(c.CNI == "meshwire" && len(c.Nodes) >= 2 && c.Fortio, "%s, %d node(s), fortio %v", c.CNI, len(c.Nodes), c.Fortio))
	cfg := latRedirectFP
	cfg.NS = "mwk-fp-placement"
	framework.Require(t, "no namespace "+cfg.NS+" left from an earlier run", c.DeleteNamespace(ctx, cfg.NS, 2*time.Minute))
	setFastpath(t, ctx, c, true)
	server, other := c.Placement()
	placements := map[string]string{"same node": server, "other node": other}
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cfg.NS}}, metav1.CreateOptions{})
	framework.Require(t, "namespace "+cfg.NS, err)
	defer func() {
		framework.Check(t, "namespace "+cfg.NS+" deleted", c.DeleteNamespace(ctx, cfg.NS, 2*time.Minute))
	}()
	latencyPod(t, ctx, c, cfg, "server", server)
	for p, node := range placements {
		latencyPod(t, ctx, c, cfg, clientName(p), node)
	}
	_, err = c.Client.CoreV1().Services(cfg.NS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "server", Namespace: cfg.NS},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "server"},
			Ports: []corev1.ServicePort{{Name: "http-echo", Port: 8080, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	framework.Require(t, "Service server", err)
	pods := []string{"server", clientName("same node"), clientName("other node")}
	for _, p := range pods {
		framework.Require(t, p+" Ready", framework.Poll(2*time.Minute, podReady(ctx, c, cfg.NS, p)))
	}
	svc, err := c.Client.CoreV1().Services(cfg.NS).Get(ctx, "server", metav1.GetOptions{})
	framework.Require(t, "Service server", err)
	url := "http://" + svc.Spec.ClusterIP + ":8080/echo"

	load := func(client string, n int) {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		out, err := c.Exec(cctx, cfg.NS, client, "app", "/usr/bin/fortio", "load", "-qps", "1000", "-c", "4", "-n", fmt.Sprint(n),
			"-payload-size", "64", "-json", "-", url)
		framework.Require(t, client+": fortio load", err)
		r, err := framework.ParseFortio(out)
		framework.Require(t, client+": fortio's result", err)
		framework.Checkf(t, fmt.Sprintf("%s: %d requests answered 200", client, n), r.Requests() == int64(n) && r.Failed() == 0,
			"%d of %d failed: %v", r.Failed(), r.Requests(), r.RetCodes)
	}
	snap := func() map[string]map[string]float64 {
		s := map[string]map[string]float64{}
		for _, n := range c.Nodes {
			m, err := framework.Metrics(ctx, n)
			framework.Require(t, n.Name+"'s metrics", err)
			s[n.Name] = map[string]float64{}
			for k, v := range m {
				if strings.HasPrefix(k, "meshwire_fastpath_") {
					s[n.Name][k] = v
				}
			}
		}
		return s
	}
	// counts is a snapshot as framework.FastpathCounts reads it.
	counts := func(s map[string]map[string]float64) map[string]framework.FastpathCount {
		out := map[string]framework.FastpathCount{}
		for nd, m := range s {
			if m["meshwire_fastpath_attached"] == 1 {
				out[nd] = framework.FastpathCount{Messages: m["meshwire_fastpath_redirected_messages_total"], PeerPairs: m["meshwire_fastpath_peer_pairs_total"]}
			}
		}
		return out
	}
	dir := reportDir("fastpath-placement")
	_ = os.MkdirAll(dir, 0o755)
	sockets := func(tag string) {
		for _, p := range pods {
			pod, err := c.Client.CoreV1().Pods(cfg.NS).Get(ctx, p, metav1.GetOptions{})
			if err != nil || len(pod.Status.ContainerStatuses) == 0 {
				continue
			}
			_, id, _ := strings.Cut(pod.Status.ContainerStatuses[0].ContainerID, "://")
			pid := pidOfContainer(id)
			if pid == "" {
				t.Logf("%s: no process of container %s found", p, id)
				continue
			}
			out, err := exec.Command("nsenter", "-t", pid, "-n", "ss", "-tanie").CombinedOutput()
			if err != nil {
				t.Logf("%s: ss: %v", p, err)
			}
			cg, _ := os.ReadFile("/proc/" + pid + "/cgroup")
			_ = os.WriteFile(filepath.Join(dir, tag+"-"+p+".ss"), append(append(cg, '\n'), out...), 0o644)
		}
		agents, err := c.Pods(ctx, "kube-system", "app.kubernetes.io/name=meshwire")
		if err != nil {
			t.Logf("meshwire's agents: %v", err)
		}
		for _, a := range agents {
			out, err := c.Exec(ctx, "kube-system", a.Name, "node", "meshwire", "fastpath", "status", "-o", "json", "--cgroup", "/host/sys/fs/cgroup")
			if err != nil {
				t.Logf("%s: meshwire fastpath status: %v", a.Spec.NodeName, err)
			}
			_ = os.WriteFile(filepath.Join(dir, tag+"-status-"+a.Spec.NodeName+".json"), []byte(out), 0o644)
		}
	}

	for _, client := range []string{clientName("same node"), clientName("other node")} {
		load(client, 200) // warm-up: the connections' first messages race the pairing
	}
	const n = 2000
	for i, p := range []string{"same node", "other node", "other node", "same node"} {
		client := clientName(p)
		before := snap()
		load(client, n)
		after := snap()
		sockets(fmt.Sprintf("%d-%s", i+1, strings.ReplaceAll(p, " ", "-")))
		var names []string
		for k := range after[server] {
			names = append(names, k)
		}
		slices.Sort(names)
		var b strings.Builder
		fmt.Fprintf(&b, "load %d, %s client (%s), server on %s, %d requests; counters' change per node:\n", i+1, p, placements[p], server, n)
		for _, nd := range c.Nodes {
			fmt.Fprintf(&b, "  %s:", nd.Name)
			for _, k := range names {
				if d := after[nd.Name][k] - before[nd.Name][k]; d != 0 || k == "meshwire_fastpath_redirected_messages_total" {
					fmt.Fprintf(&b, " %s %+g", strings.TrimPrefix(k, "meshwire_fastpath_"), d)
				}
			}
			fmt.Fprintf(&b, " (sockets now %g, pod_policies %g, attached %g)\n", after[nd.Name]["meshwire_fastpath_sockets"],
				after[nd.Name]["meshwire_fastpath_pod_policies"], after[nd.Name]["meshwire_fastpath_attached"])
		}
		t.Log(b.String())
		framework.Check(t, fmt.Sprintf("load %d, %s client: the fast path on the client's node and on the server's carried at least a message per request", i+1, p),
			framework.FastpathCarried(counts(before), counts(after), []string{placements[p], server}, n))
	}
}

// pidOfContainer is a process of the container whose id is id (its
// cgroup path names it), "" when none.
func pidOfContainer(id string) string {
	if id == "" {
		return ""
	}
	paths, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), id) {
			return filepath.Base(filepath.Dir(p))
		}
	}
	return ""
}
