//go:build cluster

package clustersuites

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

// TestStatusGate (one node, containerd 2, meshwire): containerd 2 calls
// the plugins' CNI STATUS (the conflist is at cniVersion 1.1.0) and gates
// the node on it. While host-local's STATUS says not ready (its store made
// unusable: the network's data directory replaced by a file), the node's
// runtime reports NetworkReady=false, the node turns NotReady, and a pod
// bound to it gets no sandbox (no ADD); once the store is back, the node
// turns Ready and the pod starts, its ADD logged.
func TestStatusGate(t *testing.T) {
	c := framework.Load(t)
	ctx := context.Background()
	framework.Require(t, "the cluster's network is meshwire", checkCNI(c, "meshwire"))
	if c.Runtime != "containerd2" || len(c.Nodes) != 1 {
		t.Fatalf("the STATUS suite needs one node on containerd 2 (make cluster RUNTIME=containerd2), this cluster is %d node(s) on %q", len(c.Nodes), c.Runtime)
	}
	node := c.Nodes[0]
	const ns = "mwk-status"
	fresh(t, ctx, c, ns)
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	framework.Must(t, "namespace "+ns, err)
	t.Cleanup(func() { _ = c.DeleteNamespace(ctx, ns, 2*time.Minute) })
	framework.Require(t, node.Name+" Ready", framework.Poll(time.Minute, nodeReady(ctx, c, node.Name)))

	// The store of the cluster's network (host-local's dataDir default).
	store := filepath.Join(node.VarLibCNI, "networks", "mwk-cluster")
	aside := store + ".mwk-status-test"
	framework.Require(t, "host-local's store "+store, exists(store))
	restored := false
	restore := func() error {
		if restored {
			return nil
		}
		restored = true
		if err := os.Remove(store); err != nil {
			return err
		}
		return os.Rename(aside, store)
	}
	t.Cleanup(func() { _ = restore() })
	framework.Must(t, "move the store aside", os.Rename(store, aside))
	framework.Must(t, "a file where the store's directory was", os.WriteFile(store, []byte("not a directory\n"), 0o600))

	framework.Eventually(t, "the runtime reports NetworkReady=false: the node turns NotReady", 2*time.Minute, func() error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status == corev1.ConditionTrue {
					return fmt.Errorf("Ready")
				}
				if !strings.Contains(cond.Message, "NetworkReady=false") {
					return fmt.Errorf("NotReady, but: %s", cond.Message)
				}
				t.Logf("the node's Ready condition: %s", cond.Message)
				return nil
			}
		}
		return fmt.Errorf("no Ready condition")
	})
	// A pod bound to the node (no scheduler, which would keep it off a
	// NotReady node), tolerating the not-ready taint.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gated", Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:                      node.Name,
			TerminationGracePeriodSeconds: &[]int64{1}[0],
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:                    []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10.1", ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	}
	p, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	framework.Require(t, "pod gated bound to "+node.Name, err)
	adds := func() int { return countPluginCommands(node, "ADD", p.CreationTimestamp.Time) }
	time.Sleep(20 * time.Second)
	p, err = c.Client.CoreV1().Pods(ns).Get(ctx, "gated", metav1.GetOptions{})
	framework.Must(t, "pod gated", err)
	framework.Checkf(t, "while STATUS says not ready, the pod got no sandbox (no CNI ADD in 20 s, not Running)",
		adds() == 0 && p.Status.Phase != corev1.PodRunning, "%d ADDs, phase %s", adds(), p.Status.Phase)

	framework.Must(t, "the store put back", restore())
	framework.Eventually(t, "STATUS ready again: the node Ready", 2*time.Minute, nodeReady(ctx, c, node.Name))
	framework.Eventually(t, "the gated pod Running, its ADD logged", 2*time.Minute, func() error {
		if err := podReady(ctx, c, ns, "gated")(); err != nil {
			return err
		}
		if adds() == 0 {
			return fmt.Errorf("no ADD logged")
		}
		return nil
	})
}

func exists(path string) error {
	_, err := os.Stat(path)
	return err
}

// countPluginCommands counts the successful commands (ADD, DEL, ...) the
// node's intercept plugin logged since since.
func countPluginCommands(n framework.Node, command string, since time.Time) int {
	b, err := os.ReadFile(n.PluginLog)
	if err != nil {
		return 0
	}
	count := 0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"command":"`+command+`"`) && strings.Contains(line, `"msg":"done"`) && strings.Contains(line, `"plugin":"intercept"`) {
			var ts struct {
				Time time.Time `json:"time"`
			}
			if json.Unmarshal([]byte(line), &ts) == nil && !ts.Time.Before(since) {
				count++
			}
		}
	}
	return count
}
