//go:build cluster

package clustersuites

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

const (
	faultsNS     = "mwk-faults"
	faultsMeshNS = "mwk-faults-mesh"
)

// TestNodeFaults (two nodes or more): one node, the victim, loses power
// (every process of it killed at once through its cgroup, its network
// namespace and /run gone, its disk kept: cluster.sh node kill) while a
// client on another node sends requests through a Service to web pods on
// the victim, and the victim also runs a meshed pod (REDIRECT, the fast
// path) and an ambient pod (the agent with --ambient, a ztunnel stand-in
// per node). The web pods are rescheduled on the surviving node and the
// traffic recovers. When the victim boots again (cluster.sh node boot), its
// runtime tears down the dead sandboxes (their CNI DEL, without a network
// namespace), its pods get new sandboxes, and its agent holds exactly the
// live pods: fast-path policies, the intercept records, the ambient
// enrollment handed to the new stand-in, IPAM reservations. Finally the
// victim is removed for good (cluster.sh node remove): nothing of it stays
// on the host, and the traffic goes on.
func TestNodeFaults(t *testing.T) {
	c := framework.Load(t)
	ctx := context.Background()
	if len(c.Nodes) < 2 {
		t.Fatalf("the node-fault suite needs 2 nodes or more, the cluster has %d (make cluster NODES=2)", len(c.Nodes))
	}
	framework.Require(t, "the cluster's network is meshwire", checkCNI(c, "meshwire"))
	survivor, victim := c.Nodes[0], c.Nodes[len(c.Nodes)-1]
	t.Logf("victim %s (%s), survivor %s", victim.Name, victim.IP, survivor.Name)
	fresh(t, ctx, c, faultsNS, faultsMeshNS, ambNS, ambClientNS, ztNS)
	t.Cleanup(func() {
		for _, ns := range []string{faultsNS, faultsMeshNS, ambNS, ambClientNS, ztNS} {
			_ = c.DeleteNamespace(ctx, ns, 3*time.Minute)
		}
		setAmbient(t, ctx, c, false)
	})

	t.Log("the workloads: web and the client, a meshed pod and an ambient pod on the victim")
	setAmbient(t, ctx, c, true)
	apply(t, ctx, c, "ambient-ztunnel.yaml", nil)
	for _, n := range c.Nodes {
		framework.Require(t, "the stand-in on "+n.Name+" connected", framework.Poll(2*time.Minute, framework.MetricIs(ctx, n, "meshwire_ambient_ztunnels_connected", 1)))
	}
	apply(t, ctx, c, "faults.yaml", map[string]string{"VICTIM": victim.Name, "SURVIVOR": survivor.Name})
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: faultsMeshNS}}, metav1.CreateOptions{})
	framework.Must(t, "namespace "+faultsMeshNS, err)
	vars := meshVars("redirect", "app-redirect", victim.Name)
	vars["NAMESPACE"] = faultsMeshNS
	apply(t, ctx, c, "mesh.yaml", vars)
	apply(t, ctx, c, "ambient.yaml", map[string]string{"NODE_A": victim.Name, "NODE_B": survivor.Name})
	_, err = c.Client.CoreV1().Namespaces().Patch(ctx, ambNS, types.MergePatchType, []byte(`{"metadata":{"labels":{"istio.io/dataplane-mode":"ambient"}}}`), metav1.PatchOptions{})
	framework.Must(t, "label "+ambNS+" ambient", err)
	web, err := c.WaitReady(ctx, faultsNS, "app=web", 2, 3*time.Minute)
	framework.Require(t, "web's 2 pods Ready", err)
	for _, p := range web {
		framework.Checkf(t, "web pod "+p.Name+" on the victim", p.Spec.NodeName == victim.Name, "on %s", p.Spec.NodeName)
	}
	framework.Require(t, "the client Ready", framework.Poll(2*time.Minute, podReady(ctx, c, faultsNS, "client")))
	_, err = c.WaitReady(ctx, faultsMeshNS, "app=app-redirect", 1, 2*time.Minute)
	framework.Require(t, "the meshed pod Ready", err)
	framework.Require(t, "the ambient app Ready", framework.Poll(2*time.Minute, podReady(ctx, c, ambNS, "app")))
	framework.Require(t, "the ambient app enrolled on the victim", framework.Poll(time.Minute, framework.MetricIs(ctx, victim, "meshwire_ambient_enrolled_pods", 1)))
	framework.Require(t, "the meshed pod's fast-path policy on the victim", framework.Poll(time.Minute, framework.MetricIs(ctx, victim, "meshwire_fastpath_pod_policies", 1)))
	framework.Eventually(t, "the client's requests answered", 30*time.Second, func() error {
		return clientTraffic(ctx, c, time.Now().Add(-3*time.Second), "", victim.Name)
	})
	appUID, _ := podUID(ctx, c, ambNS, "app")
	before := sandboxes(t, victim, "ADD", time.Time{})
	t.Logf("the victim's intercept plugin set up %d sandboxes before the power cut", len(before))

	t.Log("the power cut")
	cut := time.Now()
	framework.Require(t, "cluster.sh node kill "+victim.Name, nodeCommand(c, "kill", victim.Name))
	framework.Eventually(t, "web rescheduled: 2 pods Ready off "+victim.Name, 4*time.Minute, func() error {
		pods, err := c.WaitReady(ctx, faultsNS, "app=web", 2, time.Second)
		if err != nil {
			return err
		}
		for _, p := range pods {
			if p.Spec.NodeName == victim.Name {
				return fmt.Errorf("%s on %s", p.Name, p.Spec.NodeName)
			}
		}
		return nil
	})
	var outage time.Duration
	framework.Eventually(t, "the client's traffic recovered off "+victim.Name, time.Minute, func() error {
		err := clientTraffic(ctx, c, time.Now().Add(-5*time.Second), victim.Name)
		outage = time.Since(cut)
		return err
	})
	t.Logf("the traffic recovered within %s of the power cut (the node's unreachable taint comes after kube-controller-manager's grace period)", outage.Round(time.Second))

	t.Log("the victim boots")
	boot := time.Now()
	framework.Require(t, "cluster.sh node boot "+victim.Name, nodeCommand(c, "boot", victim.Name))
	framework.Eventually(t, victim.Name+" Ready again", 3*time.Minute, nodeReady(ctx, c, victim.Name))
	framework.Eventually(t, "the victim's agent Ready again", 3*time.Minute, func() error {
		pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=meshwire", FieldSelector: "spec.nodeName=" + victim.Name})
		if err != nil {
			return err
		}
		if len(pods.Items) != 1 || !framework.Ready(&pods.Items[0]) {
			return fmt.Errorf("%d agent pods, none Ready", len(pods.Items))
		}
		return nil
	})
	_, err = c.WaitReady(ctx, faultsMeshNS, "app=app-redirect", 1, 3*time.Minute)
	framework.Check(t, "the meshed pod Ready again, on a new sandbox", err)
	framework.Check(t, "the ambient app Ready again", framework.Poll(3*time.Minute, podReady(ctx, c, ambNS, "app")))
	// kubelet stops the dead sandboxes of pods still bound to the node at
	// once, and those of pods deleted meanwhile (web's, evicted) at its
	// next garbage collection.
	framework.Eventually(t, "the victim's runtime tore down every dead sandbox (a DEL logged after the boot for each)", 5*time.Minute, func() error {
		dels := sandboxes(t, victim, "DEL", boot)
		var missing []string
		for id, pod := range before {
			if _, ok := dels[id]; !ok {
				missing = append(missing, id[:12]+" ("+pod+")")
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("no DEL of %s", strings.Join(missing, ", "))
		}
		return nil
	})
	framework.Eventually(t, "the victim's fast path holds the meshed pod's policy only (1)", time.Minute, framework.MetricIs(ctx, victim, "meshwire_fastpath_pod_policies", 1))
	framework.Eventually(t, "the victim's agent checks the meshed pod only (1 intercept record)", time.Minute, framework.MetricIs(ctx, victim, "meshwire_intercept_pods", 1))
	framework.Eventually(t, "the ambient app enrolled again on the victim (1)", time.Minute, framework.MetricIs(ctx, victim, "meshwire_ambient_enrolled_pods", 1))
	framework.Eventually(t, "the victim's new stand-in got the ambient app", time.Minute, func() error {
		pods, err := c.Client.CoreV1().Pods(ztNS).List(ctx, metav1.ListOptions{LabelSelector: "app=ztunnel", FieldSelector: "spec.nodeName=" + victim.Name})
		if err != nil || len(pods.Items) == 0 {
			return fmt.Errorf("no stand-in on %s: %v", victim.Name, err)
		}
		out, err := c.Logs(ctx, ztNS, pods.Items[0].Name, "ztunnel")
		if err != nil {
			return err
		}
		if n := countRecords(out, isAdd(appUID)); n < 1 {
			return fmt.Errorf("%d adds of the app", n)
		}
		return nil
	})
	framework.Check(t, "the victim's IPAM holds an address for each of its live pods only", reservationsMatch(ctx, c, victim))

	t.Log("the victim removed for good")
	framework.Require(t, "cluster.sh node remove "+victim.Name, nodeCommand(c, "remove", victim.Name))
	framework.Check(t, "nothing of "+victim.Name+" left on the host", nodeGone(c, victim))
	framework.Eventually(t, "the client's traffic goes on", time.Minute, func() error { return clientTraffic(ctx, c, time.Now().Add(-5*time.Second), victim.Name) })
}

// nodeCommand runs cluster.sh node VERB NAME.
func nodeCommand(c *framework.Cluster, verb, name string) error {
	out, err := exec.Command(c.Script(), "node", verb, name).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v:\n%s", err, out)
	}
	return nil
}

func podUID(ctx context.Context, c *framework.Cluster, ns, name string) (string, error) {
	p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	return string(p.UID), nil
}

// clientTraffic: the client's requests since from were all answered, by
// web pods on node, or (node empty) on any node but avoid (their hostname
// names the pod; the node is looked up).
func clientTraffic(ctx context.Context, c *framework.Cluster, from time.Time, avoid string, node ...string) error {
	out, err := c.Logs(ctx, faultsNS, "client", "client")
	if err != nil {
		return err
	}
	pods, err := c.Pods(ctx, faultsNS, "app=web")
	if err != nil {
		return err
	}
	where := map[string]string{}
	for _, p := range pods {
		where[p.Name] = p.Spec.NodeName
	}
	n := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		ts, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || time.Unix(ts, 0).Before(from) {
			continue
		}
		if f[1] != "ok" || len(f) < 3 {
			return fmt.Errorf("a request failed at %s", time.Unix(ts, 0).UTC().Format("15:04:05"))
		}
		if on := where[f[2]]; (len(node) > 0 && on != node[0]) || (avoid != "" && on == avoid) {
			return fmt.Errorf("answered by %s, on %q", f[2], on)
		}
		n++
	}
	if n < 3 {
		return fmt.Errorf("%d requests answered since %s", n, from.UTC().Format("15:04:05"))
	}
	return nil
}

// sandboxes are the container ids the node's intercept plugin logged a
// successful command for (ADD or DEL), since since, each with its pod's
// name as the node's containerd labels the sandbox (empty when it has no
// such sandbox).
func sandboxes(t *testing.T, n framework.Node, command string, since time.Time) map[string]string {
	b, err := os.ReadFile(n.PluginLog)
	framework.Must(t, "the plugin log of "+n.Name, err)
	ids := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		var r struct {
			Time        time.Time `json:"time"`
			Msg         string    `json:"msg"`
			Plugin      string    `json:"plugin"`
			Command     string    `json:"command"`
			ContainerID string    `json:"containerID"`
		}
		if json.Unmarshal([]byte(line), &r) != nil || r.Plugin != "intercept" || r.Command != command || r.Msg != "done" || r.Time.Before(since) {
			continue
		}
		ids[r.ContainerID] = sandboxPod(n, r.ContainerID)
	}
	return ids
}

// sandboxPod is the pod name containerd on n labels sandbox id with.
func sandboxPod(n framework.Node, id string) string {
	out, err := exec.Command("ctr", "-a", filepath.Join(n.Dir, "containerd.sock"), "-n", "k8s.io", "containers", "info", id).Output()
	if err != nil {
		return ""
	}
	var info struct {
		Labels map[string]string `json:"Labels"`
	}
	_ = json.Unmarshal(out, &info)
	return info.Labels["io.kubernetes.pod.namespace"] + "/" + info.Labels["io.kubernetes.pod.name"]
}

// reservationsMatch: the node's IPAM reservations (the leak snapshot's,
// taken in the node) are the addresses of its pods with a network of their
// own, one each.
func reservationsMatch(ctx context.Context, c *framework.Cluster, n framework.Node) error {
	f, err := os.CreateTemp("", "mwk-snapshot-*.json")
	if err != nil {
		return err
	}
	f.Close()
	defer os.Remove(f.Name())
	if out, err := n.Command(filepath.Join(c.Repo, "bin", "test", "snapshot"), "save", f.Name(), "-wait", "1s").CombinedOutput(); err != nil {
		return fmt.Errorf("snapshot in %s: %v: %s", n.Name, err, out)
	}
	b, err := os.ReadFile(f.Name())
	if err != nil {
		return err
	}
	var s struct{ Parts map[string][]string }
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	held := map[string]bool{}
	for _, r := range s.Parts["reservations"] {
		if f := strings.Fields(r); len(f) >= 2 {
			held[f[1]] = true
		}
	}
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, p := range pods.Items {
		if !p.Spec.HostNetwork && p.Status.PodIP != "" && p.DeletionTimestamp == nil {
			want[p.Status.PodIP] = true
		}
	}
	var extra, missing []string
	for ip := range held {
		if !want[ip] {
			extra = append(extra, ip)
		}
	}
	for ip := range want {
		if !held[ip] {
			missing = append(missing, ip)
		}
	}
	if len(extra)+len(missing) > 0 {
		return fmt.Errorf("reserved but no live pod's: %v; a live pod's but not reserved: %v", extra, missing)
	}
	return nil
}

// nodeGone: the host has nothing of the removed node: its network
// namespace, its underlay interface, its cgroups, its directory, its
// route, its Node object.
func nodeGone(c *framework.Cluster, n framework.Node) error {
	var left []string
	if _, err := os.Stat("/run/netns/" + n.Name); err == nil {
		left = append(left, "network namespace")
	}
	if _, err := os.Stat("/sys/class/net/" + n.Name); err == nil {
		left = append(left, "interface "+n.Name)
	}
	if out, _ := exec.Command("ip", "-4", "route", "show", "via", n.IP).Output(); strings.TrimSpace(string(out)) != "" {
		left = append(left, "routes via "+n.IP+": "+strings.TrimSpace(string(out)))
	}
	if n.Dir != "" {
		if _, err := os.Stat(n.Dir); err == nil {
			left = append(left, "directory "+n.Dir)
		}
	}
	_ = filepath.WalkDir("/sys/fs/cgroup", func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if d.Name() == n.Name {
			left = append(left, "cgroup "+p)
			return filepath.SkipDir
		}
		if strings.Count(p, "/") > 6 {
			return filepath.SkipDir
		}
		return nil
	})
	if _, err := c.Client.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{}); err == nil {
		left = append(left, "Node object")
	}
	if len(left) > 0 {
		return fmt.Errorf("left: %s", strings.Join(left, "; "))
	}
	return nil
}
