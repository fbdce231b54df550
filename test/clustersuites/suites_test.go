//go:build cluster

// Package clustersuites is meshwire's cluster suites, Go tests against the
// cluster test/cluster/cluster.sh starts (make cluster), built with the
// "cluster" tag and run by the cluster make targets: smoke, mesh, ambient,
// podstart, Kubernetes' e2e suite with the reference plugins as the
// control, and the multi-node ones. Each check is reported through
// framework.Check: a failed check fails the test, which goes on to list
// the others.
package clustersuites

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

// get asks for url from a busybox container with wget (busybox's timeout,
// not wget -T: Debian's static busybox 1.35 wget crashes with -T).
func get(ctx context.Context, c *framework.Cluster, ns, pod, container, url string) (string, error) {
	out, err := c.Exec(ctx, ns, pod, container, "timeout", "10", "wget", "-q", "-O", "-", url)
	return strings.TrimSpace(out), err
}

// answers is a check's error: the reply, unless it is want.
func answers(reply string, err error, want string) error {
	if err != nil {
		return err
	}
	if reply != want {
		return fmt.Errorf("answered %q, want %q", reply, want)
	}
	return nil
}

// answeredFrom is the index of the address among addrs that an app's
// /clientip reply (the connection's source, ADDR:PORT or [ADDR]:PORT)
// names; else an error that says whose addresses they are, and 0.
func answeredFrom(reply string, err error, whose string, addrs ...string) (int, error) {
	if err != nil {
		return 0, err
	}
	for i, a := range addrs {
		if strings.HasPrefix(reply, net.JoinHostPort(a, "")) {
			return i, nil
		}
	}
	return 0, fmt.Errorf("the application saw %q, not %s %s", reply, whose, strings.Join(addrs, " or "))
}

// apply renders manifests/NAME with vars and applies it, or ends t.
func apply(t *testing.T, ctx context.Context, c *framework.Cluster, name string, vars map[string]string) {
	t.Helper()
	b, err := c.Manifest(name, vars)
	framework.Must(t, "render "+name, err)
	framework.Must(t, "apply "+name, c.Apply(ctx, b))
}

// legs are the networks a comparing suite runs on, in order: those the
// environment variable env names (blank-separated; only blanks: none),
// else def.
func legs(env string, def ...string) []string {
	if s := os.Getenv(env); s != "" {
		return strings.Fields(s)
	}
	return def
}

// clusterOf is the running cluster when its network is cni and it has
// life.Nodes nodes; else the running one is taken down, with its leak
// checks, and a fresh one of cni started.
func clusterOf(t *testing.T, life framework.Lifecycle, cni string) *framework.Cluster {
	t.Helper()
	if c, ok := framework.Running(); !ok || c.CNI != cni || len(c.Nodes) != life.Nodes {
		if ok {
			framework.Require(t, "the running cluster ("+c.CNI+") taken down", life.Down("running"))
		}
		framework.Require(t, cni+": cluster up", life.Up(cni, cni))
	}
	return framework.Load(t)
}

// fresh waits until namespaces of an earlier run are gone.
func fresh(t *testing.T, ctx context.Context, c *framework.Cluster, namespaces ...string) {
	t.Helper()
	for _, ns := range namespaces {
		framework.Require(t, "no namespace "+ns+" left from an earlier run", c.WaitNamespaceGone(ctx, ns, 2*time.Minute))
	}
}

// containsLine says whether one line of out, trimmed, is line.
func containsLine(out, line string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

// placed checks that each pod runs on the node it was placed on.
func placed(t *testing.T, ctx context.Context, c *framework.Cluster, ns string, want map[string]string) {
	t.Helper()
	for pod, node := range want {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err == nil && p.Spec.NodeName != node {
			err = fmt.Errorf("on %s", p.Spec.NodeName)
		}
		framework.Check(t, fmt.Sprintf("%s/%s runs on %s", ns, pod, node), err)
	}
}

// checkCNI is nil when the cluster's network is kind (meshwire, or
// reference: the control).
func checkCNI(c *framework.Cluster, kind string) error {
	if c.CNI != kind {
		return fmt.Errorf("the cluster's network is %s (MESHWIRE_CLUSTER_CNI), this suite needs %s", c.CNI, kind)
	}
	return nil
}

// podReady is a condition: pod ns/name is Ready.
func podReady(ctx context.Context, c *framework.Cluster, ns, name string) func() error {
	return func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !framework.Ready(p) {
			return fmt.Errorf("%s/%s not Ready (%s)", ns, name, p.Status.Phase)
		}
		return nil
	}
}

// nodeReady is a condition: the node's Ready condition is true.
func nodeReady(ctx context.Context, c *framework.Cluster, name string) func() error {
	return func() error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("node %s not Ready", name)
	}
}

// podOn is the name of the pod of ns matching selector on node, not being
// deleted.
func podOn(ctx context.Context, c *framework.Cluster, ns, selector, node string) (string, error) {
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return "", err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			return p.Name, nil
		}
	}
	return "", fmt.Errorf("no pod %s in %s on %s", selector, ns, node)
}
