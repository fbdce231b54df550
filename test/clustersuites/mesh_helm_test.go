//go:build cluster

package clustersuites

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

// loadDuration is how long fortio sends its load (mesh-fortio.yaml); the
// upgrade starts a few seconds into it and must end before it does.
const loadDuration = 150 * time.Second

// upgrade is what TestMesh's helm upgrade did, for its checks.
type upgrade struct {
	tag        string
	start, end time.Time
	created    []corev1.Pod // the pods created while it ran
}

// growth is a Deployment scaled while the upgrade runs, on its node.
type growth struct {
	node, deploy string
	replicas     int32
}

// helmUpgrade is the rollout of a cluster installed with helm
// (MESHWIRE_CLUSTER_INSTALL=helm): `helm upgrade --reuse-values --set
// image.tag=` the other of the two tags, while fortio sends its load
// through the servers' sidecars (mesh-fortio.yaml) and new meshed pods
// are created on each node: one when the upgrade starts, one more each
// time the node's agent is not Ready (its old pod going, its new one
// starting). It returns once every agent is replaced and every new pod is
// Ready; upgradeChecks judges the rest.
func (m *mesh) helmUpgrade() *upgrade {
	t, ctx, c := m.t, m.ctx, m.c
	r := m.rolloutStart()
	up := &upgrade{tag: r.image[strings.LastIndex(r.image, ":")+1:]}
	servers, callers := c.Placement()
	grow := []growth{{node: servers, deploy: "app-redirect"}, {node: callers, deploy: "caller-redirect"}}
	before := map[types.UID]bool{}
	for i, g := range grow {
		pods, err := c.Pods(ctx, meshNS, "app="+g.deploy)
		framework.Require(t, "the pods of "+g.deploy, err)
		for _, p := range pods {
			before[p.UID] = true
		}
		grow[i].replicas = int32(len(pods))
	}

	apply(t, ctx, c, "mesh-fortio.yaml", map[string]string{"NODE": m.callers, "DURATION": loadDuration.String()})
	framework.Require(t, "fortio's load running", framework.Poll(time.Minute, podRunning(ctx, c, meshNS, "fortio")))
	time.Sleep(5 * time.Second)

	up.start = time.Now()
	out, err := c.Helm(ctx, "upgrade", "meshwire", filepath.Join(c.Repo, "conf", "helm", "meshwire"), "-n", "kube-system",
		"--reuse-values", "--set", "image.tag="+up.tag)
	framework.Require(t, "helm upgrade meshwire --reuse-values --set image.tag="+up.tag, err)
	t.Logf("%s", strings.TrimSpace(out))
	done := make(chan struct{})
	var wg sync.WaitGroup
	var errs []error
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs = m.grow(done, grow)
	}()
	m.rolloutDone(r, false)
	close(done)
	wg.Wait()
	up.end = time.Now()
	for _, err := range errs {
		framework.Check(t, "a Deployment scaled during the upgrade", err)
	}
	t.Logf("helm upgrade to %s: %s from the command to the last agent Ready", up.tag, up.end.Sub(up.start).Round(100*time.Millisecond))
	for _, g := range grow {
		pods, err := c.WaitReady(ctx, meshNS, "app="+g.deploy, int(g.replicas), 3*time.Minute)
		framework.Require(t, fmt.Sprintf("%s's %d pods Ready", g.deploy, g.replicas), err)
		for _, p := range pods {
			if !before[p.UID] {
				up.created = append(up.created, p)
			}
		}
	}
	return up
}

// grow scales each Deployment up by one at once, then by one more each
// time its node's agent pod stops being Ready (or goes), until done; at
// most to 5 replicas. It returns the scalings that failed.
func (m *mesh) grow(done <-chan struct{}, grow []growth) []error {
	ctx, c := m.ctx, m.c
	var errs []error
	scale := func(g *growth) {
		if g.replicas >= 5 {
			return
		}
		g.replicas++
		patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, g.replicas)
		_, err := c.Client.AppsV1().Deployments(meshNS).Patch(ctx, g.deploy, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s to %d: %w", g.deploy, g.replicas, err))
			return
		}
		m.t.Logf("%s: %s scaled to %d", time.Now().Format("15:04:05.000"), g.deploy, g.replicas)
	}
	for i := range grow {
		scale(&grow[i])
	}
	gap := map[string]bool{}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return errs
		case <-tick.C:
		}
		pods, err := c.Pods(ctx, "kube-system", "app.kubernetes.io/name=meshwire")
		if err != nil {
			continue
		}
		ready := map[string]bool{}
		for i := range pods {
			if pods[i].DeletionTimestamp == nil && framework.Ready(&pods[i]) {
				ready[pods[i].Spec.NodeName] = true
			}
		}
		for i := range grow {
			g := &grow[i]
			if !ready[g.node] && !gap[g.node] {
				m.t.Logf("%s: %s's agent not Ready", time.Now().Format("15:04:05.000"), g.node)
				scale(g)
			}
			gap[g.node] = !ready[g.node]
		}
	}
}

// upgradeChecks: every pod created during the upgrade answers through its
// sidecar (its rules are in place), and fortio's load through the
// upgrade lost no request, at 10 requests a second, on connections that
// held.
func (m *mesh) upgradeChecks(up *upgrade) {
	t, ctx, c := m.t, m.ctx, m.c
	framework.Checkf(t, "pods were created during the upgrade", len(up.created) > 0, "none")
	for _, p := range up.created {
		reply, err := get(ctx, c, meshNS, "client", "client", "http://"+p.Status.PodIP+":8080/clientip")
		framework.Check(t, fmt.Sprintf("%s, created during the upgrade on %s at %s: client -> its app through its sidecar",
			p.Name, p.Spec.NodeName, p.CreationTimestamp.Format("15:04:05")), viaSidecar(reply, err))
		if c.Family() == "dual" {
			addr := net.JoinHostPort(framework.PodIPv6(&p), "8080")
			reply, err := get(ctx, c, meshNS, "client", "client", "http://"+addr+"/clientip")
			framework.Check(t, fmt.Sprintf("%s: client -> its app at %s through its sidecar", p.Name, addr), viaSidecar6(reply, err))
		}
	}

	framework.Require(t, "fortio's load ended", framework.Poll(loadDuration+2*time.Minute, func() error {
		p, err := c.Client.CoreV1().Pods(meshNS).Get(ctx, "fortio", metav1.GetOptions{})
		if err != nil {
			return err
		}
		switch p.Status.Phase {
		case corev1.PodSucceeded:
			return nil
		case corev1.PodFailed:
			return fmt.Errorf("fortio failed: %s", p.Status.Message)
		}
		return fmt.Errorf("fortio %s", p.Status.Phase)
	}))
	want := int64(10 * loadDuration / time.Second)
	for _, mode := range meshModes {
		log, err := c.Logs(ctx, meshNS, "fortio", mode)
		framework.Require(t, "the log of fortio's "+mode, err)
		r, err := framework.ParseFortio(log)
		if !framework.Check(t, "fortio's result for "+mode, err) {
			continue
		}
		t.Logf("fortio -> app-%s: %d requests, codes %v, %.2f qps, %d connections, %s to %s", mode, r.Requests(), r.RetCodes,
			r.ActualQPS, r.SocketCount, r.StartTime.Format("15:04:05.000"), r.End().Format("15:04:05.000"))
		framework.Checkf(t, fmt.Sprintf("fortio -> app-%s: the load spanned the upgrade (%s to %s)", mode,
			up.start.Format("15:04:05.000"), up.end.Format("15:04:05.000")),
			!r.StartTime.After(up.start) && r.End().After(up.end), "the load ran from %s to %s",
			r.StartTime.Format("15:04:05.000"), r.End().Format("15:04:05.000"))
		framework.Checkf(t, fmt.Sprintf("fortio -> app-%s: %d requests at 10 qps (at least 90%% of %d)", mode, r.Requests(), want),
			r.Requests()*10 >= want*9, "%d requests", r.Requests())
		framework.Checkf(t, fmt.Sprintf("fortio -> app-%s: no request failed during the upgrade", mode),
			r.Failed() == 0, "%d of %d failed (codes %v)", r.Failed(), r.Requests(), r.RetCodes)
		framework.Checkf(t, fmt.Sprintf("fortio -> app-%s: its keep-alive connection held (one connection)", mode),
			r.SocketCount == 1, "%d connections opened", r.SocketCount)
	}
	m.longHeld("after the load")
}

// podRunning is a condition: every container of pod ns/name runs.
func podRunning(ctx context.Context, c *framework.Cluster, ns, name string) func() error {
	return func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(p.Status.ContainerStatuses) == 0 {
			return fmt.Errorf("%s/%s: %s", ns, name, p.Status.Phase)
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.State.Running == nil {
				return fmt.Errorf("%s/%s: container %s not running", ns, name, s.Name)
			}
		}
		return nil
	}
}
