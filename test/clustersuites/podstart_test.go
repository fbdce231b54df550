//go:build cluster

package clustersuites

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

// Pod start's targets against the control (the reference plugins v1.9.1 in
// the same conflist): meshwire's network setup is a few milliseconds of a
// pod start that kubelet, containerd and runc take seconds for, so pod
// start must not be slower than the control's by more than the clusters'
// own spread (docs/kubernetes.md).
var podStartTargets = []framework.PodStartTarget{{Percentile: 50, Max: 1.10}, {Percentile: 99, Max: 1.20}}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// TestPodStart times pod start on the running cluster: PODSTART_PODS pods
// (30) created at once, PODSTART_ROUNDS rounds (3); the result as JSON to
// PODSTART_OUT when set.
func TestPodStart(t *testing.T) {
	c := framework.Load(t)
	res := podStart(t, c)
	if out := os.Getenv("PODSTART_OUT"); out != "" {
		b, _ := json.Marshal(res)
		framework.Must(t, "write "+out, os.WriteFile(out, b, 0o644))
	}
}

func podStart(t *testing.T, c *framework.Cluster) framework.PodStartResult {
	pods, rounds := envInt("PODSTART_PODS", 30), envInt("PODSTART_ROUNDS", 3)
	t.Logf("%d pods at once, %d rounds, on %s, %d node(s)", pods, rounds, c.CNI, len(c.Nodes))
	res, err := framework.PodStart(context.Background(), c.Client, pods, rounds, "registry.k8s.io/pause:3.10.1", t.Logf)
	framework.Require(t, "pod start measured", err)
	t.Logf("all rounds: %d pods, create to Ready p50 %.0f ms, p99 %.0f ms", len(res.StartMS),
		framework.Percentile(res.StartMS, 50), framework.Percentile(res.StartMS, 99))
	return res
}

// TestPodStartCompare: pod start on fresh clusters in the order meshwire,
// reference, reference, meshwire (PODSTART_LEGS legs, 4 by default),
// MESHWIRE_CLUSTER_NODES nodes, each taken down with its leak checks; the
// pooled p50 and p99 judged against the targets above.
func TestPodStartCompare(t *testing.T) {
	order := []string{"meshwire", "reference", "reference", "meshwire"}
	all := map[string]framework.PodStartResult{}
	var medians []string
	legs := alternateLegs(t, "podstart", order, func(name, cni string, c *framework.Cluster) any {
		res := podStart(t, c)
		all[cni] = all[cni].Add(res)
		medians = append(medians, fmt.Sprintf("%s %.0f ms", name, framework.Percentile(res.StartMS, 50)))
		return res
	})
	table, err := framework.ComparePodStart("meshwire", all["meshwire"], "reference v1.9.1", all["reference"], podStartTargets)
	text := fmt.Sprintf("pod start, %s, %d node(s), %d legs (%s)\n\n%s\neach cluster's p50: %s\n\n%s",
		time.Now().UTC().Format("2006-01-02"), clusterNodes(), legs, strings.Join(order[:min(legs, len(order))], ", "), table, strings.Join(medians, ", "),
		framework.CompareCPU("meshwire", all["meshwire"], "reference v1.9.1", all["reference"]))
	_ = os.WriteFile(reportDir("podstart", "summary.txt"), []byte(text), 0o644)
	t.Log("\n" + text)
	framework.Check(t, "pod start within its targets against the control", err)
}

// alternateLegs runs leg on PODSTART_LEGS fresh clusters (len(order) by
// default) of MESHWIRE_CLUSTER_NODES nodes whose networks follow order,
// over again when the legs outnumber it, after taking down the running
// cluster; each leg's cluster is named N-NETWORK, its result kept as
// suite/N-NETWORK.json in the report directory, and it is taken down
// with its leak checks. It returns how many legs ran.
func alternateLegs(t *testing.T, suite string, order []string, leg func(name, cni string, c *framework.Cluster) any) int {
	repo, err := filepath.Abs("../..")
	framework.Must(t, "the repository", err)
	life := framework.Lifecycle{Repo: repo, Nodes: clusterNodes(), Logs: reportDir(suite, "lifecycle")}
	if _, ok := framework.Running(); ok {
		framework.Require(t, "the running cluster taken down", life.Down("running"))
	}
	n := envInt("PODSTART_LEGS", len(order))
	for i := 0; i < n; i++ {
		cni := order[i%len(order)]
		name := fmt.Sprintf("%d-%s", i+1, cni)
		framework.Require(t, name+": cluster up", life.Up(cni, name))
		b, _ := json.MarshalIndent(leg(name, cni, framework.Load(t)), "", "  ")
		_ = os.WriteFile(reportDir(suite, name+".json"), b, 0o644)
		framework.Check(t, name+": cluster down, its leak checks passed", life.Down(name))
	}
	return n
}
