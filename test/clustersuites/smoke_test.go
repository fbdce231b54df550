//go:build cluster

package clustersuites

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

// TestSmoke: a busybox client reaches agnhost netexec behind a ClusterIP
// Service by the Service's IP and by its DNS names through CoreDNS, and a
// pod that the chained intercept plugin intercepts (its annotation) is
// answered by its "proxy" on 15006; on a cluster of several nodes the
// client runs on another node than the servers.
func TestSmoke(t *testing.T) {
	c := framework.Load(t)
	ctx := context.Background()
	const ns = "mwk-smoke"
	fresh(t, ctx, c, ns)
	a, b := c.Placement()
	apply(t, ctx, c, "smoke.yaml", map[string]string{"NODE_A": a, "NODE_B": b})
	defer func() { framework.Check(t, "namespace "+ns+" deleted", c.DeleteNamespace(ctx, ns, 2*time.Minute)) }()
	for _, sel := range []string{"app=echo", "app=meshed"} {
		_, err := c.WaitReady(ctx, ns, sel, 1, 2*time.Minute)
		framework.Require(t, "pod "+sel+" Ready", err)
	}
	_, err := c.WaitReady(ctx, ns, "", 3, 2*time.Minute)
	framework.Require(t, "3 pods Ready", err)
	placed(t, ctx, c, ns, map[string]string{"echo": a, "meshed": a, "client": b})

	svc, err := c.Client.CoreV1().Services(ns).Get(ctx, "echo", metav1.GetOptions{})
	framework.Require(t, "Service echo", err)
	fqdn := "echo." + ns + ".svc.cluster.local"
	// CoreDNS caches answers for 30 s: a name of an earlier run's Service
	// may still resolve to its address; wait for the current one.
	framework.Eventually(t, fqdn+" resolves to "+svc.Spec.ClusterIP, time.Minute, func() error {
		out, err := c.Exec(ctx, ns, "client", "client", "nslookup", fqdn)
		if err != nil {
			return err
		}
		if !containsLine(out, "Address: "+svc.Spec.ClusterIP) {
			return framework.ErrNotYet
		}
		return nil
	})
	for _, target := range []string{svc.Spec.ClusterIP, fqdn, "echo"} {
		reply, err := get(ctx, c, ns, "client", "client", "http://"+target+"/hostname")
		framework.Check(t, "client -> http://"+target+"/hostname answered by echo", answers(reply, err, "echo"))
	}
	// The intercept plugin: the annotated pod's inbound connections reach
	// its proxy (port 15006), not the app; the echo pod above was left
	// alone (its app answered).
	target := "meshed." + ns + ".svc.cluster.local"
	reply, err := get(ctx, c, ns, "client", "client", "http://"+target+"/")
	framework.Check(t, "client -> http://"+target+"/ (app port 8080) answered by the pod's proxy on 15006", answers(reply, err, "intercepted"))
}
