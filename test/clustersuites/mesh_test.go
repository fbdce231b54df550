//go:build cluster

package clustersuites

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshwire/meshwire/internal/proxylog"
	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

const meshNS = "mwk-mesh"

var meshModes = []string{"redirect", "tproxy", "ebpf"}

// meshVars fills manifests/mesh.yaml for one mode's Deployment (the
// cluster fills @ISTIO_DUAL_STACK@: framework.FamilyVars).
func meshVars(mode, name, node string) map[string]string {
	v := map[string]string{"NAMESPACE": meshNS, "NAME": name, "NODE": node, "MODE": mode, "ISTIO_MODE": "REDIRECT",
		"MESHWIRE_MODE": strings.ToUpper(mode), "PROXY_MODE": "redirect", "PROXY_UID": "1337", "PROXY_CAPS": "[]"}
	if mode == "tproxy" {
		v["ISTIO_MODE"], v["PROXY_MODE"], v["PROXY_UID"], v["PROXY_CAPS"] = "TPROXY", "tproxy", "0", "[NET_ADMIN]"
	}
	return v
}

// TestMesh: Istio-annotated pods in REDIRECT, TPROXY and EBPF mode behind
// NodePort Services, their servers on one node and meshed callers on
// another (on a cluster of several nodes every pair crosses nodes), with
// the fast path each node's agent attached; a new meshwire image rolled
// out under them. Checked at each stage: every request reached the
// application through its sidecar (from 127.0.0.6, the sidecar's
// passthrough address), every sidecar-to-sidecar request is in the calling
// sidecar's outbound log with the Service's ClusterIP as its original
// destination, no sidecar got a connection for its status ports (every
// replica's log read, none may be empty), each node's fast path holds a
// policy per meshed pod of the node and carried messages, EBPF mode's
// programs hold the node's EBPF pods, and the long-lived connections held.
// On a cluster started on an earlier meshwire (make cluster FROM=COMMIT)
// the rollout is the upgrade to this tree's, and the nodes' records of
// the earlier stores become one record per pod (mesh_upgrade_test.go).
// On a dual-stack cluster (make cluster IP_FAMILY=dual) the pods are
// dual stack as Istio makes them (ISTIO_DUAL_STACK, mesh.yaml), the
// Services RequireDualStack, and the same is checked over each family by
// address: IPv6 to the Services' IPv6 ClusterIPs and the servers' IPv6
// addresses (the app sees ::6, Istio's IPv6 passthrough address), sidecar
// to sidecar with the ClusterIP of the family in the caller's outbound
// log, and a long-lived connection per mode and family (mesh-long.yaml);
// by name, the family the resolver picks. A pod per mode without
// ISTIO_DUAL_STACK (nodual-MODE) shows Istio's decision the other way: its
// IPv4 comes through its sidecar, its IPv6 reaches the app directly.
// On a cluster installed with helm (make cluster INSTALL=helm) the rollout
// is `helm upgrade --set image.tag=`, under fortio's load and with pods
// created while it runs (mesh_helm_test.go).
func TestMesh(t *testing.T) {
	c := framework.Load(t)
	ctx := context.Background()
	framework.Require(t, "the cluster's network is meshwire", checkCNI(c, "meshwire"))
	fresh(t, ctx, c, meshNS)
	servers, callers := c.Placement()
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: meshNS}}, metav1.CreateOptions{})
	framework.Require(t, "namespace "+meshNS, err)
	deleted := false
	defer func() {
		if !deleted {
			framework.Check(t, "namespace "+meshNS+" deleted", c.DeleteNamespace(ctx, meshNS, 2*time.Minute))
		}
	}()
	deployments := []string{"app-", "caller-"}
	if c.Family() == "dual" {
		deployments = append(deployments, "nodual-")
	}
	for _, m := range meshModes {
		apply(t, ctx, c, "mesh.yaml", meshVars(m, "app-"+m, servers))
		apply(t, ctx, c, "mesh.yaml", meshVars(m, "caller-"+m, callers))
		apply(t, ctx, c, "mesh-service.yaml", map[string]string{"NAMESPACE": meshNS, "MODE": m})
		if c.Family() == "dual" {
			v := meshVars(m, "nodual-"+m, servers)
			v["ISTIO_DUAL_STACK"] = "false"
			apply(t, ctx, c, "mesh.yaml", v)
		}
	}
	for _, m := range meshModes {
		for _, prefix := range deployments {
			name := prefix + m
			_, err := c.WaitReady(ctx, meshNS, "app="+name, 1, 2*time.Minute)
			framework.Require(t, name+" Ready", err)
		}
	}
	// The callers' node serves each Service (its kube-proxy has the
	// Service's rules, endpoints included) before any traffic starts: on
	// several nodes the endpoints reach each node's kube-proxy on its own
	// time, and a first request before that fails (seen on two nodes:
	// the first request timed out, long's nc exited).
	callerNode, err := c.Node(callers)
	framework.Require(t, "the callers' node", err)
	for _, m := range meshModes {
		framework.Eventually(t, "the callers' node serves Service app-"+m, time.Minute, func() error {
			svc, err := c.Client.CoreV1().Services(meshNS).Get(ctx, "app-"+m, metav1.GetOptions{})
			if err != nil {
				return err
			}
			addr := net.JoinHostPort(callerNode.IP, strconv.Itoa(int(nodePort(svc, "http"))))
			_, err = hostGet("http://" + addr + "/clientip")
			return err
		})
		// And CoreDNS answers the Service's name: it caches a name's
		// absence for up to 30 s (its cache plugin), and an earlier
		// run's pods asked for these names after their Services went
		// (seen: every run after the first on one cluster failed its
		// first request by name).
		framework.Eventually(t, "CoreDNS answers app-"+m+"'s name with its ClusterIP", time.Minute, func() error {
			return dnsAnswers(ctx, c, "app-"+m+"."+meshNS+".svc.cluster.local")
		})
	}
	m := &mesh{t: t, ctx: ctx, c: c, callers: callers, long: []string{"long"}}
	apply(t, ctx, c, "mesh-clients.yaml", map[string]string{"NODE": callers})
	for _, p := range []string{"client", "long"} {
		framework.Require(t, p+" Ready", framework.Poll(2*time.Minute, podReady(ctx, c, meshNS, p)))
	}
	if c.Family() == "dual" {
		// long by address, once per family (long4, long6), once the
		// client reaches each Service at its IPv6 ClusterIP
		// (kube-proxy syncs each family on its own).
		vars4 := map[string]string{"NAME": "long4", "NODE": callers}
		vars6 := map[string]string{"NAME": "long6", "NODE": callers}
		for _, mode := range meshModes {
			svc, err := c.Client.CoreV1().Services(meshNS).Get(ctx, "app-"+mode, metav1.GetOptions{})
			framework.Require(t, "Service app-"+mode, err)
			v6 := clusterIPv6(t, svc)
			addr := net.JoinHostPort(v6, "80")
			framework.Eventually(t, "the client reaches Service app-"+mode+" at "+addr, time.Minute, func() error {
				_, err := get(ctx, c, meshNS, "client", "client", "http://"+addr+"/clientip")
				return err
			})
			vars4[strings.ToUpper(mode)], vars6[strings.ToUpper(mode)] = svc.Spec.ClusterIP, v6
		}
		for _, vars := range []map[string]string{vars4, vars6} {
			apply(t, ctx, c, "mesh-long.yaml", vars)
			framework.Require(t, vars["NAME"]+" Ready", framework.Poll(2*time.Minute, podReady(ctx, c, meshNS, vars["NAME"])))
			m.long = append(m.long, vars["NAME"])
		}
	}
	m.check("before the rollout")

	// A new image tag rolled out under the running pods: every node's
	// agent restarts; connections stay up, and the pods' fast-path
	// policies come back from the plugin's records.
	lines := map[string]int{}
	for _, pod := range m.long {
		for _, mode := range meshModes {
			lines[pod+"/"+mode] = m.longLines(pod, mode)
		}
	}
	var old map[string]stores
	if c.From != "" {
		old = m.fourStores()
	}
	var up *upgrade
	if c.Install == "helm" {
		up = m.helmUpgrade()
	} else {
		m.rollout()
	}
	time.Sleep(3 * time.Second)
	for _, pod := range m.long {
		for _, mode := range meshModes {
			n, before := m.longLines(pod, mode), lines[pod+"/"+mode]
			framework.Checkf(t, fmt.Sprintf("after the rollout: %s's long-lived connection to %s held (%d lines echoed before, %d now)", pod, mode, before, n),
				n > before, "it echoed nothing since")
		}
	}
	if up == nil {
		// A pod started after the rollout is meshed by the new agent's plugins.
		scale := fmt.Sprintf(`{"spec":{"replicas":2}}`)
		_, err = c.Client.AppsV1().Deployments(meshNS).Patch(ctx, "app-redirect", "application/merge-patch+json", []byte(scale), metav1.PatchOptions{})
		framework.Require(t, "app-redirect scaled to 2", err)
		_, err = c.WaitReady(ctx, meshNS, "app=app-redirect", 2, 2*time.Minute)
		framework.Require(t, "app-redirect's 2 pods Ready", err)
	}
	m.check("after the rollout")
	if old != nil {
		m.oneRecordPerPod(old)
	}
	if up != nil {
		m.upgradeChecks(up)
	}

	deleted = framework.Check(t, "namespace "+meshNS+" deleted", c.DeleteNamespace(ctx, meshNS, 2*time.Minute))
	for _, n := range c.Nodes {
		framework.Eventually(t, "the meshed pods are gone: no pod policy left on "+n.Name, 30*time.Second,
			framework.MetricIs(ctx, n, "meshwire_fastpath_pod_policies", 0))
	}
}

type mesh struct {
	t       *testing.T
	ctx     context.Context
	c       *framework.Cluster
	callers string   // the node of the callers and clients
	long    []string // the pods of long-lived connections: long, and long4 and long6 in dual stack
}

// clusterIPv6 is the Service's IPv6 ClusterIP, which a dual-stack
// cluster must give it (RequireDualStack), or it ends the test.
func clusterIPv6(t *testing.T, svc *corev1.Service) string {
	v6 := framework.IPv6(svc.Spec.ClusterIPs)
	if v6 == "" {
		framework.Require(t, "Service "+svc.Name+" has an IPv6 ClusterIP (RequireDualStack)", fmt.Errorf("its ClusterIPs are %v", svc.Spec.ClusterIPs))
	}
	return v6
}

// check runs every check of one stage.
func (m *mesh) check(stage string) {
	t, ctx, c := m.t, m.ctx, m.c
	caller, err := c.Node(m.callers)
	framework.Require(t, "the callers' node", err)
	before := m.redirected()
	for i, mode := range meshModes {
		next := meshModes[(i+1)%len(meshModes)]
		svc, err := c.Client.CoreV1().Services(meshNS).Get(ctx, "app-"+mode, metav1.GetOptions{})
		framework.Require(t, stage+": Service app-"+mode, err)
		np := nodePort(svc, "http")
		nodePortAddr := net.JoinHostPort(caller.IP, strconv.Itoa(int(np)))
		// Each family's way through the sidecars: the passthrough
		// address the app sees and the ClusterIP the calling sidecar
		// logs as the original destination. By name, either: the
		// resolver picks the family (on a dual-stack cluster busybox's
		// wget and agnhost's curl were seen to take IPv6).
		v4 := route{passthrough4, svc.Spec.ClusterIP}
		only4 := []route{v4}
		targets := []target{{"app-" + mode, only4}, {svc.Spec.ClusterIP, only4}, {nodePortAddr, only4}}
		calls := []target{{"app-" + mode, only4}}
		if c.Family() == "dual" {
			// Over IPv6 too: to the Service's IPv6 ClusterIP, and to
			// each server's IPv6 address (no kube-proxy on the way);
			// the host's NodePort stays IPv4: the one node's IPv6
			// address is the machine's uplink, which tests never use.
			// Sidecar to sidecar, each family by address as well as
			// by name.
			v6 := route{passthrough6, clusterIPv6(t, svc)}
			byName := []route{v4, v6}
			targets[0].routes = byName
			targets = append(targets, target{net.JoinHostPort(v6.clusterIP, "80"), []route{v6}})
			servers, err := c.Pods(ctx, meshNS, "app=app-"+mode)
			framework.Require(t, stage+": app-"+mode, err)
			for _, p := range servers {
				ip := framework.PodIPv6(&p)
				if framework.Checkf(t, stage+": "+p.Name+" has an IPv6 address", ip != "", "its addresses are %v", p.Status.PodIPs) {
					targets = append(targets, target{net.JoinHostPort(ip, "8080"), []route{v6}})
				}
			}
			calls = []target{{"app-" + mode, byName}, {v4.clusterIP, []route{v4}}, {"[" + v6.clusterIP + "]", []route{v6}}}
		}
		for _, tg := range targets {
			reply, err := get(ctx, c, meshNS, "client", "client", "http://"+tg.addr+"/clientip")
			_, err = passedThrough(reply, err, tg.routes...)
			framework.Check(t, fmt.Sprintf("%s: client -> %s via %s: through the sidecar", stage, mode, tg.addr), err)
		}
		reply, err := hostGet("http://" + nodePortAddr + "/clientip")
		framework.Check(t, fmt.Sprintf("%s: host -> %s via NodePort %s: through the sidecar", stage, mode, nodePortAddr), viaSidecar(reply, err))
		// Sidecar to sidecar: next's caller's app, through its sidecar's
		// outbound listener, to mode's Service, then mode's server's
		// sidecar's inbound one.
		pods, err := c.Pods(ctx, meshNS, "app=caller-"+next)
		framework.Require(t, stage+": caller-"+next, err)
		for _, call := range calls {
			for _, p := range pods {
				outs := map[route]int{}
				for _, r := range call.routes {
					outs[r] = m.count(p.Name, r.outbound)
				}
				out, err := c.Exec(ctx, meshNS, p.Name, "app", "curl", "-gsS", "-m", "10", "http://"+call.addr+"/clientip")
				r, err := passedThrough(strings.TrimSpace(out), err, call.routes...)
				framework.Check(t, fmt.Sprintf("%s: %s's app on %s -> %s via %s: through both sidecars", stage, p.Name, p.Spec.NodeName, mode, call.addr), err)
				n := m.count(p.Name, r.outbound)
				framework.Checkf(t, fmt.Sprintf("%s: %s's sidecar logged the connection (outbound to %s)", stage, p.Name, r.origDst()),
					outs[r] >= 0 && n >= outs[r]+1, "%d such connections before, %d after", outs[r], n)
			}
		}
		if c.Family() == "dual" {
			m.noDualStack(stage, mode)
		}
	}
	// Kubelet's probes of the status ports: never captured, on any
	// replica; a replica whose log cannot be read fails.
	meshed, err := c.Pods(ctx, meshNS, "mesh.meshwire.io/mode")
	framework.Require(t, stage+": the meshed pods", err)
	for _, p := range meshed {
		n := m.count(p.Name, func(r proxylog.Record) bool {
			return r.Event == "conn" && (strings.HasSuffix(r.OrigDst, ":15020") || strings.HasSuffix(r.OrigDst, ":15021"))
		})
		framework.Checkf(t, fmt.Sprintf("%s: %s's sidecar got no connection for its status ports", stage, p.Name),
			n == 0, "%s", statusPortFailure(n))
	}
	// Each node's fast path: a policy per meshed pod of the node, messages
	// carried where meshed pods are, EBPF mode's pods registered.
	after := m.redirected()
	for _, node := range c.Nodes {
		var pods, ebpf int
		for _, p := range meshed {
			if p.Spec.NodeName == node.Name {
				pods++
				if p.Labels["mesh.meshwire.io/mode"] == "ebpf" {
					ebpf++
				}
			}
		}
		framework.Check(t, fmt.Sprintf("%s: %s's fast path holds %d pod policies (one per meshed pod)", stage, node.Name, pods),
			framework.MetricIs(ctx, node, "meshwire_fastpath_pod_policies", float64(pods))())
		framework.Check(t, fmt.Sprintf("%s: %s's EBPF mode holds %d pods", stage, node.Name, ebpf),
			framework.MetricIs(ctx, node, "meshwire_capture_pods", float64(ebpf))())
		if pods > 0 {
			framework.Checkf(t, fmt.Sprintf("%s: %s's fast path carried messages between apps and sidecars (%g)", stage, node.Name, after[node.Name]-before[node.Name]),
				after[node.Name] > before[node.Name], "%g before, %g after", before[node.Name], after[node.Name])
		}
	}
	m.longHeld(stage)
}

// noDualStack: mode's pods without ISTIO_DUAL_STACK, whose first address
// is IPv4, have no IPv6 capture, as Istio decides (istio-iptables programs
// IPv6 rules for them only with dual stack): the client reaches each one's
// app through its sidecar over IPv4, and directly over IPv6 (the app sees
// the client's own IPv6 address).
func (m *mesh) noDualStack(stage, mode string) {
	t, ctx, c := m.t, m.ctx, m.c
	client, err := c.Client.CoreV1().Pods(meshNS).Get(ctx, "client", metav1.GetOptions{})
	framework.Require(t, stage+": pod client", err)
	client6 := framework.PodIPv6(client)
	pods, err := c.Pods(ctx, meshNS, "app=nodual-"+mode)
	framework.Require(t, stage+": nodual-"+mode, err)
	for _, p := range pods {
		reply, err := get(ctx, c, meshNS, "client", "client", "http://"+net.JoinHostPort(p.Status.PodIP, "8080")+"/clientip")
		framework.Check(t, fmt.Sprintf("%s: client -> %s (%s, no ISTIO_DUAL_STACK) at %s: through the sidecar", stage, p.Name, mode, p.Status.PodIP), viaSidecar(reply, err))
		addr := net.JoinHostPort(framework.PodIPv6(&p), "8080")
		reply, err = get(ctx, c, meshNS, "client", "client", "http://"+addr+"/clientip")
		_, err = answeredFrom(reply, err, "the client's", client6)
		framework.Check(t, fmt.Sprintf("%s: client -> %s at %s: not captured, the app saw the client's own address", stage, p.Name, addr), err)
	}
}

// longHeld: no container of the long-lived connections' pods restarted
// (nc exits when its connection breaks).
func (m *mesh) longHeld(stage string) {
	for _, pod := range m.long {
		p, err := m.c.Client.CoreV1().Pods(meshNS).Get(m.ctx, pod, metav1.GetOptions{})
		framework.Require(m.t, stage+": pod "+pod, err)
		for _, s := range p.Status.ContainerStatuses {
			framework.Checkf(m.t, fmt.Sprintf("%s: %s's long-lived connection to %s held", stage, pod, s.Name), s.RestartCount == 0, "%d restarts", s.RestartCount)
		}
	}
}

// statusPortFailure describes a count of m.count: -1 is a log that could
// not be read or holds no "ready" record.
func statusPortFailure(n int) string {
	if n < 0 {
		return "its log is missing or empty"
	}
	return fmt.Sprintf("%d connections: kubelet's probes were captured", n)
}

// count is how many records of pod's sidecar log match, or -1 when the log
// cannot be read or lacks the proxy's "ready" record (an empty log judges
// nothing).
func (m *mesh) count(pod string, match func(proxylog.Record) bool) int {
	out, err := m.c.Logs(m.ctx, meshNS, pod, "istio-proxy")
	if err != nil {
		return -1
	}
	return countRecords(out, match)
}

// countRecords counts the proxy log's records that match, or -1 without a
// "ready" record.
func countRecords(log string, match func(proxylog.Record) bool) int {
	n, ready := 0, false
	for _, line := range strings.Split(log, "\n") {
		var r proxylog.Record
		if json.Unmarshal([]byte(line), &r) != nil {
			continue
		}
		if r.Event == "ready" {
			ready = true
		}
		if match(r) {
			n++
		}
	}
	if !ready {
		return -1
	}
	return n
}

// redirected is each node's count of messages its fast path carried.
func (m *mesh) redirected() map[string]float64 {
	out := map[string]float64{}
	for _, n := range m.c.Nodes {
		v, err := framework.Metric(m.ctx, n, "meshwire_fastpath_redirected_messages_total")
		framework.Must(m.t, "the fast path's counter on "+n.Name, err)
		out[n.Name] = v
	}
	return out
}

// longLines is how many lines pod's long-lived connection to mode echoed.
func (m *mesh) longLines(pod, mode string) int {
	out, err := m.c.Logs(m.ctx, meshNS, pod, mode)
	framework.Must(m.t, "the log of "+pod+"'s "+mode, err)
	return strings.Count(out, "\n")
}

// rollout rolls the agent's DaemonSet to the other of its two image tags
// (latest, rollout): every node's agent pod is replaced, every node stays
// Ready, and the fast path's policies are restored on every node.
func (m *mesh) rollout() {
	t, ctx, c := m.t, m.ctx, m.c
	r := m.rolloutStart()
	r.ds.Spec.Template.Spec.Containers[0].Image = r.image
	_, err := c.Client.AppsV1().DaemonSets("kube-system").Update(ctx, r.ds, metav1.UpdateOptions{})
	framework.Require(t, "the DaemonSet's image set to "+r.image, err)
	m.rolloutDone(r, true)
}

// rolling is a rollout under way: the DaemonSet before it, the image it
// rolls out, the agents' pods and each node's fast-path policies before.
type rolling struct {
	ds       *appsv1.DaemonSet
	image    string
	old      []corev1.Pod
	policies map[string]float64
}

// rolloutStart reads what a rollout is judged against, and picks the
// other of the two image tags.
func (m *mesh) rolloutStart() *rolling {
	t, ctx, c := m.t, m.ctx, m.c
	ds, err := c.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "meshwire-node", metav1.GetOptions{})
	framework.Require(t, "meshwire's DaemonSet", err)
	r := &rolling{ds: ds, policies: map[string]float64{}, image: "localhost/meshwire:rollout"}
	for _, n := range c.Nodes {
		r.policies[n.Name], err = framework.Metric(ctx, n, "meshwire_fastpath_pod_policies")
		framework.Require(t, "the pod policies of "+n.Name, err)
	}
	r.old, err = c.Pods(ctx, "kube-system", "app.kubernetes.io/name=meshwire")
	framework.Require(t, "the agents' pods", err)
	if ds.Spec.Template.Spec.Containers[0].Image == r.image {
		r.image = "localhost/meshwire:latest"
	}
	t.Logf("rolling out %s", r.image)
	return r
}

// rolloutDone waits until every agent pod is replaced by one of the new
// image and Ready, and every node Ready; with samePolicies, until each
// node's fast path holds the policies it held before (no pod came or went
// meanwhile).
func (m *mesh) rolloutDone(r *rolling, samePolicies bool) {
	t, ctx, c := m.t, m.ctx, m.c
	image, old, policies := r.image, r.old, r.policies
	framework.Eventually(t, "the rollout of "+image+" done: every agent pod replaced and Ready", 3*time.Minute, func() error {
		pods, err := c.Pods(ctx, "kube-system", "app.kubernetes.io/name=meshwire")
		if err != nil {
			return err
		}
		if len(pods) != len(c.Nodes) {
			return fmt.Errorf("%d agent pods, want %d", len(pods), len(c.Nodes))
		}
		for i := range pods {
			p := &pods[i]
			for _, o := range old {
				if o.UID == p.UID {
					return fmt.Errorf("%s not replaced yet", p.Name)
				}
			}
			if p.Spec.Containers[0].Image != image || !framework.Ready(p) {
				return fmt.Errorf("%s not Ready with %s yet", p.Name, image)
			}
		}
		return nil
	})
	for _, n := range c.Nodes {
		framework.Eventually(t, "node "+n.Name+" Ready after the rollout", time.Minute, nodeReady(ctx, c, n.Name))
		if samePolicies {
			framework.Eventually(t, fmt.Sprintf("%s's fast-path policies restored (%g)", n.Name, policies[n.Name]), time.Minute,
				framework.MetricIs(ctx, n, "meshwire_fastpath_pod_policies", policies[n.Name]))
		}
	}
}

// The sidecar's passthrough addresses, from which it connects to the app:
// Istio's InboundPassthroughBindIpv4 and InboundPassthroughBindIpv6.
const passthrough4, passthrough6 = "127.0.0.6", "::6"

// route is an address family's way through the sidecars to a Service's
// app: the sidecar's passthrough address of the family, which the app
// sees, and the Service's ClusterIP of the family, which the calling
// sidecar logs as the original destination (port 80).
type route struct{ passthrough, clusterIP string }

func (r route) origDst() string { return net.JoinHostPort(r.clusterIP, "80") }

// outbound matches the calling sidecar's record of a connection by r.
func (r route) outbound(rec proxylog.Record) bool {
	return rec.Event == "conn" && rec.Listener == "outbound" && rec.OrigDst == r.origDst()
}

// target is an address to call and the routes a call to it may take.
type target struct {
	addr   string
	routes []route
}

// passedThrough is the route, among routes, whose passthrough address the
// application's /clientip answered: the connection came through the
// sidecar over that route's family. Else an error, and routes[0].
func passedThrough(reply string, err error, routes ...route) (route, error) {
	srcs := make([]string, len(routes))
	for i, r := range routes {
		srcs[i] = r.passthrough
	}
	i, err := answeredFrom(reply, err, "the sidecar's", srcs...)
	return routes[i], err
}

// viaSidecar is a check's error: nil when the application's /clientip
// answered the sidecar's passthrough address (127.0.0.6): the connection
// came through the sidecar.
func viaSidecar(reply string, err error) error {
	_, err = passedThrough(reply, err, route{passthrough: passthrough4})
	return err
}

// viaSidecar6 is viaSidecar over IPv6 (::6).
func viaSidecar6(reply string, err error) error {
	_, err = passedThrough(reply, err, route{passthrough: passthrough6})
	return err
}

func nodePort(svc *corev1.Service, name string) int32 {
	for _, p := range svc.Spec.Ports {
		if p.Name == name {
			return p.NodePort
		}
	}
	return 0
}

// hostGet asks url from the host (the test's own process).
func hostGet(url string) (string, error) {
	cl := http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b)), err
}

// dnsAnswers: every CoreDNS pod answers name with the ClusterIP of the
// Service it names (asked at the pod's own address, which the host
// routes to on every node count).
func dnsAnswers(ctx context.Context, c *framework.Cluster, name string) error {
	labels := strings.Split(name, ".")
	svc, err := c.Client.CoreV1().Services(labels[1]).Get(ctx, labels[0], metav1.GetOptions{})
	if err != nil {
		return err
	}
	pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
	if err != nil {
		return err
	}
	if len(pods.Items) == 0 {
		return fmt.Errorf("no CoreDNS pod")
	}
	for _, p := range pods.Items {
		ip := p.Status.PodIP
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			d := net.Dialer{Timeout: 2 * time.Second}
			return d.DialContext(ctx, "udp", net.JoinHostPort(ip, "53"))
		}}
		addrs, err := r.LookupHost(ctx, name+".")
		if err != nil {
			return fmt.Errorf("CoreDNS %s: %w", p.Name, err)
		}
		if !slices.Contains(addrs, svc.Spec.ClusterIP) {
			return fmt.Errorf("CoreDNS %s answers %v, not %s", p.Name, addrs, svc.Spec.ClusterIP)
		}
	}
	return nil
}
