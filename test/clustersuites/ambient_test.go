//go:build cluster

package clustersuites

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podstate"
	"github.com/meshwire/meshwire/internal/proxylog"
	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

// Istio ambient mode through the API server (docs/ambient.md): meshwire's
// agent with --ambient, a ztunnel stand-in per node (test/proxy -zds), an
// app in a namespace labeled and unlabeled istio.io/dataplane-mode=ambient
// on one node, its client (never enrolled) on another, and a sidecar pod
// (REDIRECT) on the client's node that calls the app and is called by it.
const (
	ambNS       = "mwk-ambient"
	ambClientNS = "mwk-ambient-client"
	ambMeshNS   = "mwk-ambient-sidecar"
	ztNS        = "mwk-ztunnel"
	ambLabel    = "istio.io/dataplane-mode"
	apiService  = "198.19.0.1"
)

type ambient struct {
	t      *testing.T
	ctx    context.Context
	c      *framework.Cluster
	app    framework.Node // the app's node (the enrolled pods')
	client framework.Node // the client's and the sidecar pod's
	appUID string
	appIP  string
	cliUID string
	cliIP  string
	svcIP  string
}

// TestAmbient: the agent with --ambient enrolls a running app when its
// namespace is labeled and hands it to the node's ztunnel stand-in; the
// client's requests and the app's own go through the stand-in's inbound
// and outbound listeners; kubelet's probes keep passing, not captured; a
// pod created in the namespace is enrolled at its CNI ADD; Istio's
// opt-out is honoured; a sidecar pod and the ambient app call each other
// through the sidecar and the stand-in; a restarted stand-in gets the
// snapshot again; removing the label unenrolls every pod; with ambient
// mode off again, no node keeps the probe rule, the probe sets or a
// record.
func TestAmbient(t *testing.T) {
	c := framework.Load(t)
	ctx := context.Background()
	framework.Require(t, "the cluster's network is meshwire", checkCNI(c, "meshwire"))
	a := &ambient{t: t, ctx: ctx, c: c}
	appNode, clientNode := c.Placement()
	var err error
	a.app, err = c.Node(appNode)
	framework.Must(t, "the app's node", err)
	a.client, err = c.Node(clientNode)
	framework.Must(t, "the client's node", err)
	fresh(t, ctx, c, ambNS, ambClientNS, ambMeshNS, ztNS)
	t.Cleanup(func() {
		for _, ns := range []string{ambNS, ambClientNS, ambMeshNS, ztNS} {
			_ = c.DeleteNamespace(ctx, ns, 2*time.Minute)
		}
		a.setAmbient(false)
	})

	// The app and its client start before ambient mode is on: their ADDs
	// write no record, and the app is enrolled at step 4 from its
	// processes, as a running pod is when its namespace is labeled.
	t.Log("0. an app and its Service, not labeled, before ambient mode")
	apply(t, ctx, c, "ambient.yaml", map[string]string{"NODE_A": a.app.Name, "NODE_B": a.client.Name})
	framework.Require(t, "the app Ready", framework.Poll(2*time.Minute, podReady(ctx, c, ambNS, "app")))
	framework.Require(t, "the client Ready", framework.Poll(2*time.Minute, podReady(ctx, c, ambClientNS, "client")))

	t.Log("1. meshwire's DaemonSet with --ambient")
	a.setAmbient(true)
	for _, n := range c.Nodes {
		framework.Eventually(t, "1. "+n.Name+"'s agent serves ambient mode's metrics, no pod enrolled", time.Minute,
			framework.MetricIs(ctx, n, "meshwire_ambient_enrolled_pods", 0))
		framework.Check(t, "1. "+n.Name+"'s agent enrolls by the API server's labels of its node",
			a.agentSays(n, "pods enrolled by the API server's labels of node "+n.Name))
	}

	t.Log("2. the ztunnel stand-in")
	apply(t, ctx, c, "ambient-ztunnel.yaml", nil)
	for _, n := range c.Nodes {
		framework.Eventually(t, "2. the stand-in on "+n.Name+" connected to its agent's ZDS socket", 2*time.Minute,
			framework.MetricIs(ctx, n, "meshwire_ambient_ztunnels_connected", 1))
	}

	t.Log("3. the app and the client, running since before ambient mode")
	a.appUID, a.appIP = a.pod(ambNS, "app")
	a.cliUID, a.cliIP = a.pod(ambClientNS, "client")
	svc, err := c.Client.CoreV1().Services(ambNS).Get(ctx, "app", metav1.GetOptions{})
	framework.Must(t, "Service app", err)
	a.svcIP = svc.Spec.ClusterIP
	t.Logf("app %s (uid %s) on %s, client %s (uid %s) on %s, Service %s", a.appIP, a.appUID, a.app.Name, a.cliIP, a.cliUID, a.client.Name, a.svcIP)
	time.Sleep(2 * time.Second)
	framework.Check(t, "3. not labeled: no pod enrolled (metric 0)", framework.MetricIs(ctx, a.app, "meshwire_ambient_enrolled_pods", 0)())
	framework.Check(t, "3. not labeled: the stand-in got no pod (no add)", a.ztNone("", isAdd("")))
	framework.Check(t, "3. client -> Service: the app answered directly", a.clientGets(a.svcIP))
	framework.Check(t, "3. that connection did not go through the stand-in", a.ztNone("", isConn("", "", "", "")))

	t.Log("4. label namespace " + ambNS + " " + ambLabel + "=ambient")
	snat0 := a.probeSNAT()
	bad0 := a.unhealthy(ambNS, "app")
	a.label(ambNS, "ambient")
	framework.Eventually(t, "4. the running app enrolled (metric 1)", 30*time.Second, framework.MetricIs(ctx, a.app, "meshwire_ambient_enrolled_pods", 1))
	framework.Check(t, "4. ... found through its processes: it started before ambient mode, with no record",
		a.agentSays(a.app, "pod "+ambNS+"/app started before ambient mode was on: recorded from its processes"))
	framework.Eventually(t, "4. the stand-in got the app (add, uid "+a.appUID+")", 30*time.Second, func() error { return a.ztHas("", isAdd(a.appUID)) })
	framework.Check(t, "4. the app's address "+a.appIP+" is in its node's probe set", a.probeSetHas(a.appIP))
	framework.Check(t, "4. client -> Service: answered, the app saw the client's own address", a.clientGets(a.svcIP))
	framework.Check(t, "4. that connection went through the stand-in's inbound listener (orig_dst "+a.appIP+":8080)",
		a.ztHas("", isConn("inbound", a.cliIP, a.appIP+":8080", a.appUID)))
	framework.Check(t, "4. the client (other namespace, other node) is not captured: no stand-in has anything of it", a.ztNoneAnywhere(a.cliUID))
	out, err := c.Exec(ctx, ambNS, "app", "app", "curl", "-sk", "-m", "10", "https://"+apiService+"/healthz")
	framework.Check(t, "4. app -> kubernetes Service https://"+apiService+"/healthz", answers(strings.TrimSpace(out), err, "ok"))
	framework.Check(t, "4. the app's outbound connection went through the stand-in's 15001 (orig_dst "+apiService+":443)",
		a.ztHas("", isConn("outbound", a.appIP, apiService+":443", a.appUID)))
	t.Log("4. the app's readiness probe (every 2 s, one failure makes it NotReady) for 12 s")
	time.Sleep(12 * time.Second)
	framework.Check(t, "4. the app stayed Ready", podReady(ctx, c, ambNS, "app")())
	framework.Checkf(t, "4. no failed probe of the app since its enrollment", a.unhealthy(ambNS, "app") == bad0,
		"kubelet's probes of the app failed (%d Unhealthy events before, %d now)", bad0, a.unhealthy(ambNS, "app"))
	snat := a.probeSNAT()
	framework.Checkf(t, "4. kubelet's probes left the node as 169.254.7.127 (ISTIO_POSTRT's SNAT)", snat0 >= 0 && snat > snat0,
		"%d packets before, %d now", snat0, snat)
	all := a.ztCount("", func(r proxylog.Record) bool { return r.Listener == "inbound" && r.Workload == a.appUID })
	client := a.ztCount("", isConn("inbound", a.cliIP, a.appIP+":8080", a.appUID))
	framework.Checkf(t, "4. the probes were not captured (the stand-in's inbound saw the client's connections only)", client > 0 && all == client,
		"the stand-in's inbound listener got %d connections to the app, %d of them the client's", all, client)

	t.Log("5, 6. pods created in the labeled namespace")
	apply(t, ctx, c, "ambient-late.yaml", map[string]string{"NODE_A": a.app.Name})
	for _, p := range []string{"late", "optout", "annotated"} {
		framework.Require(t, "5, 6. "+p+" Ready", framework.Poll(2*time.Minute, podReady(ctx, c, ambNS, p)))
	}
	lateUID, lateIP := a.pod(ambNS, "late")
	optoutUID, _ := a.pod(ambNS, "optout")
	annotatedUID, _ := a.pod(ambNS, "annotated")
	framework.Check(t, "5. the new pod late was enrolled (add)", a.ztHas("", isAdd(lateUID)))
	framework.Check(t, "5. ... at its CNI ADD: its init container's first connection went through the stand-in's 15001",
		a.ztHas("", isConn("outbound", lateIP, apiService+":443", lateUID)))
	framework.Check(t, "5. the intercept plugin's ADD of late logged the agent's answer: enrolled", a.addAnswered(lateUID))
	framework.Check(t, "6. the pod labeled "+ambLabel+"=none is not enrolled", a.ztNone("", byWorkload(optoutUID)))
	framework.Check(t, "6. the pod annotated ambient.istio.io/redirection=disabled is enrolled, as Istio 1.23+ does", a.ztHas("", isAdd(annotatedUID)))
	framework.Check(t, "5, 6. enrolled: app, late, annotated (metric 3)", framework.MetricIs(ctx, a.app, "meshwire_ambient_enrolled_pods", 3)())

	a.sidecarAndAmbient()

	t.Log("8. the stand-in restarted while pods are enrolled")
	old := a.ztPod()
	framework.Must(t, "delete the stand-in "+old, c.Client.CoreV1().Pods(ztNS).Delete(ctx, old, metav1.DeleteOptions{}))
	framework.Eventually(t, "8. a new stand-in on "+a.app.Name+" connected", 2*time.Minute, func() error {
		if p := a.ztPod(); p == "" || p == old {
			return fmt.Errorf("no new stand-in pod yet")
		}
		return framework.MetricIs(ctx, a.app, "meshwire_ambient_ztunnels_connected", 1)()
	})
	zt := a.ztPod()
	for _, uid := range []string{a.appUID, lateUID, annotatedUID} {
		framework.Eventually(t, "8. the snapshot replayed to the new stand-in: add "+uid, 30*time.Second, func() error { return a.ztHas(zt, isAdd(uid)) })
	}
	framework.Check(t, "8. the replay has no pod that is not enrolled", a.ztNone(zt, func(r proxylog.Record) bool {
		return r.Workload == optoutUID || r.Workload == a.cliUID
	}))
	framework.Check(t, "8. client -> Service after the restart: answered", a.clientGets(a.svcIP))
	framework.Check(t, "8. ... through the new stand-in's inbound listener", a.ztHas(zt, isConn("inbound", a.cliIP, a.appIP+":8080", a.appUID)))
	framework.Check(t, "8. the app is still Ready", podReady(ctx, c, ambNS, "app")())

	t.Log("7. remove the label from namespace " + ambNS)
	a.label(ambNS, "")
	framework.Eventually(t, "7. every pod unenrolled (metric 0)", 30*time.Second, framework.MetricIs(ctx, a.app, "meshwire_ambient_enrolled_pods", 0))
	for _, uid := range []string{a.appUID, lateUID, annotatedUID} {
		framework.Eventually(t, "7. the stand-in was told: del "+uid, 30*time.Second, func() error { return a.ztHas(zt, isDel(uid)) })
	}
	framework.Check(t, "7. the probe set is empty", a.probeSetEmpty())
	n0 := a.ztCount(zt, isConn("", "", "", ""))
	framework.Check(t, "7. client -> Service: answered", a.clientGets(a.svcIP))
	out, err = c.Exec(ctx, ambNS, "app", "app", "curl", "-sk", "-m", "10", "https://"+apiService+"/healthz")
	framework.Check(t, "7. app -> kubernetes Service", answers(strings.TrimSpace(out), err, "ok"))
	n := a.ztCount(zt, isConn("", "", "", ""))
	framework.Checkf(t, "7. ... both directly: the stand-in saw no connection", n0 > 0 && n == n0, "%d stand-in connections before, %d after", n0, n)
	framework.Check(t, "7. the app is still Ready", podReady(ctx, c, ambNS, "app")())

	t.Log("enrolled pods deleted (their CNI DEL), then ambient mode turned off")
	a.label(ambNS, "ambient")
	framework.Eventually(t, "the three pods enrolled again (metric 3)", 30*time.Second, framework.MetricIs(ctx, a.app, "meshwire_ambient_enrolled_pods", 3))
	for _, ns := range []string{ambNS, ambClientNS, ambMeshNS} {
		framework.Check(t, "namespace "+ns+" deleted", c.DeleteNamespace(ctx, ns, 2*time.Minute))
	}
	framework.Eventually(t, "deleted enrolled pods are unenrolled (metric 0)", 30*time.Second, framework.MetricIs(ctx, a.app, "meshwire_ambient_enrolled_pods", 0))
	framework.Check(t, "... and out of the probe set", a.probeSetEmpty())
	framework.Check(t, "namespace "+ztNS+" deleted", c.DeleteNamespace(ctx, ztNS, 2*time.Minute))
	a.setAmbient(false)
	for _, node := range c.Nodes {
		framework.Check(t, "the agent of "+node.Name+" stopped with no pod enrolled: its host rule and probe sets are gone", a.ambientGone(node))
		framework.Check(t, "no pod record or enrolled pod left on "+node.Name, a.noRecords(node))
	}
}

// sidecarAndAmbient: a sidecar pod (REDIRECT) on the client's node calls
// the ambient app, and the app calls it: each connection goes through the
// caller's sidecar or stand-in and the callee's stand-in or sidecar.
func (a *ambient) sidecarAndAmbient() {
	t, ctx, c := a.t, a.ctx, a.c
	t.Log("9. a sidecar pod and the ambient app call each other")
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ambMeshNS}}, metav1.CreateOptions{})
	framework.Must(t, "namespace "+ambMeshNS, err)
	vars := meshVars("redirect", "app-redirect", a.client.Name)
	vars["NAMESPACE"] = ambMeshNS
	apply(t, ctx, c, "mesh.yaml", vars)
	apply(t, ctx, c, "mesh-service.yaml", map[string]string{"NAMESPACE": ambMeshNS, "MODE": "redirect"})
	pods, err := c.WaitReady(ctx, ambMeshNS, "app=app-redirect", 1, 2*time.Minute)
	framework.Require(t, "9. the sidecar pod Ready", err)
	side := pods[0]
	ssvc, err := c.Client.CoreV1().Services(ambMeshNS).Get(ctx, "app-redirect", metav1.GetOptions{})
	framework.Must(t, "Service app-redirect", err)

	out, err := c.Exec(ctx, ambMeshNS, side.Name, "app", "curl", "-sS", "-m", "10", "http://app."+ambNS+"/clientip")
	reply := strings.TrimSpace(out)
	if err == nil && !strings.HasPrefix(reply, side.Status.PodIP+":") {
		err = fmt.Errorf("the app saw %q, not the sidecar pod's %s", reply, side.Status.PodIP)
	}
	framework.Check(t, "9. sidecar pod ("+a.client.Name+") -> ambient app ("+a.app.Name+"): answered, from the sidecar pod's address", err)
	framework.Check(t, "9. ... through the sidecar's outbound listener (orig_dst "+a.svcIP+":80)", countAtLeast(a.c, ctx, ambMeshNS, side.Name, func(r proxylog.Record) bool {
		return r.Event == "conn" && r.Listener == "outbound" && r.OrigDst == a.svcIP+":80"
	}))
	framework.Check(t, "9. ... and the app's stand-in's inbound listener", a.ztHas("", isConn("inbound", side.Status.PodIP, a.appIP+":8080", a.appUID)))

	out, err = c.Exec(ctx, ambNS, "app", "app", "curl", "-sS", "-m", "10", "http://app-redirect."+ambMeshNS+"/clientip")
	framework.Check(t, "9. ambient app -> sidecar pod: answered through the sidecar's inbound listener (127.0.0.6)", viaSidecar(strings.TrimSpace(out), err))
	framework.Check(t, "9. ... the app's connection went through its stand-in's outbound listener (orig_dst "+ssvc.Spec.ClusterIP+":80)",
		a.ztHas("", isConn("outbound", a.appIP, ssvc.Spec.ClusterIP+":80", a.appUID)))
}

// countAtLeast is nil when the pod's sidecar logged a record that matches.
func countAtLeast(c *framework.Cluster, ctx context.Context, ns, pod string, match func(proxylog.Record) bool) error {
	out, err := c.Logs(ctx, ns, pod, "istio-proxy")
	if err != nil {
		return err
	}
	if n := countRecords(out, match); n < 1 {
		return fmt.Errorf("%d such records in %s's sidecar log", n, pod)
	}
	return nil
}

// ------------------------------------------------------------- helpers

func (a *ambient) pod(ns, name string) (uid, ip string) {
	p, err := a.c.Client.CoreV1().Pods(ns).Get(a.ctx, name, metav1.GetOptions{})
	framework.Must(a.t, "pod "+ns+"/"+name, err)
	return string(p.UID), p.Status.PodIP
}

// clientGets: the client's request for the app's /clientip through addr
// answered with the client's own address (the stand-in keeps it).
func (a *ambient) clientGets(addr string) error {
	reply, err := get(a.ctx, a.c, ambClientNS, "client", "client", "http://"+addr+"/clientip")
	if err != nil {
		return err
	}
	if !strings.HasPrefix(reply, a.cliIP+":") {
		return fmt.Errorf("answered %q, want the client's address %s", reply, a.cliIP)
	}
	return nil
}

func (a *ambient) label(ns, value string) { labelAmbient(a.t, a.ctx, a.c, ns, value) }

// labelAmbient sets namespace ns's label istio.io/dataplane-mode to value
// ("": removes it).
func labelAmbient(t *testing.T, ctx context.Context, c *framework.Cluster, ns, value string) {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, ambLabel, value)
	if value == "" {
		patch = fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, ambLabel)
	}
	_, err := c.Client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	framework.Must(t, "label namespace "+ns, err)
}

// unhealthy is how many Unhealthy events (failed probes) the pod has.
func (a *ambient) unhealthy(ns, pod string) int {
	l, err := a.c.Client.CoreV1().Events(ns).List(a.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod + ",reason=Unhealthy"})
	framework.Must(a.t, "events of "+pod, err)
	return len(l.Items)
}

func (a *ambient) setAmbient(on bool) { setAmbient(a.t, a.ctx, a.c, on) }

// setAmbient turns --ambient on, with ambient mode's flags (--ambient-*)
// when given, or off (with its flags) in meshwire's DaemonSet (the rest of
// its command as up installed it), rolled out on every node.
func setAmbient(t *testing.T, ctx context.Context, c *framework.Cluster, on bool, flags ...string) {
	dsc := c.Client.AppsV1().DaemonSets("kube-system")
	ds, err := dsc.Get(ctx, "meshwire-node", metav1.GetOptions{})
	framework.Must(t, "meshwire's DaemonSet", err)
	cmd := ds.Spec.Template.Spec.Containers[0].Command
	var next []string
	for _, arg := range cmd {
		if arg != "--ambient" && !strings.HasPrefix(arg, "--ambient-") {
			next = append(next, arg)
		}
	}
	if on {
		next = append(append(next, "--ambient"), flags...)
	}
	if slices.Equal(next, cmd) {
		return
	}
	ds.Spec.Template.Spec.Containers[0].Command = next
	_, err = dsc.Update(ctx, ds, metav1.UpdateOptions{})
	framework.Must(t, fmt.Sprintf("--ambient %v %s in meshwire's DaemonSet", on, strings.Join(flags, " ")), err)
	framework.Must(t, "the agent's rollout", framework.Poll(3*time.Minute, func() error {
		ds, err := dsc.Get(ctx, "meshwire-node", metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := ds.Status
		if st.ObservedGeneration < ds.Generation || st.UpdatedNumberScheduled != st.DesiredNumberScheduled || st.NumberAvailable != st.DesiredNumberScheduled {
			return fmt.Errorf("rolling out: %d of %d updated, %d available", st.UpdatedNumberScheduled, st.DesiredNumberScheduled, st.NumberAvailable)
		}
		return nil
	}))
	// The API's nodes, not the description's: a suite may have removed
	// one (TestNodeFaults).
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	framework.Must(t, "the nodes", err)
	for _, n := range nodes.Items {
		framework.Must(t, "node "+n.Name+" Ready", framework.Poll(time.Minute, nodeReady(ctx, c, n.Name)))
	}
}

// agentSays: the agent of node n logged text.
func (a *ambient) agentSays(n framework.Node, text string) error {
	pods, err := a.c.Client.CoreV1().Pods("kube-system").List(a.ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=meshwire", FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		out, err := a.c.Logs(a.ctx, "kube-system", p.Name, "node")
		if err != nil {
			return err
		}
		if strings.Contains(out, text) {
			return nil
		}
		return fmt.Errorf("%s's log has no %q", p.Name, text)
	}
	return fmt.Errorf("no agent pod on %s", n.Name)
}

// ztPod is the stand-in on the app's node (not one being deleted).
func (a *ambient) ztPod() string {
	p, _ := podOn(a.ctx, a.c, ztNS, "app=ztunnel", a.app.Name)
	return p
}

// ztCount counts the stand-in's records that match (the app node's, or
// pod); -1 when its log cannot be read or lacks its "ready" record, so
// that no check passes on a log it did not see.
func (a *ambient) ztCount(pod string, match func(proxylog.Record) bool) int {
	if pod == "" {
		pod = a.ztPod()
	}
	out, err := a.c.Logs(a.ctx, ztNS, pod, "ztunnel")
	if err != nil {
		return -1
	}
	return countRecords(out, match)
}

func (a *ambient) ztHas(pod string, match func(proxylog.Record) bool) error {
	if n := a.ztCount(pod, match); n < 1 {
		return fmt.Errorf("the stand-in logged %d such records", n)
	}
	return nil
}

func (a *ambient) ztNone(pod string, match func(proxylog.Record) bool) error {
	if n := a.ztCount(pod, match); n != 0 {
		return fmt.Errorf("the stand-in logged %d such records (-1: no log)", n)
	}
	return nil
}

// ztNoneAnywhere: no stand-in of any node logged anything of the pod uid.
func (a *ambient) ztNoneAnywhere(uid string) error {
	pods, err := a.c.Pods(a.ctx, ztNS, "app=ztunnel")
	if err != nil {
		return err
	}
	for _, p := range pods {
		if err := a.ztNone(p.Name, byWorkload(uid)); err != nil {
			return fmt.Errorf("%s: %w", p.Name, err)
		}
	}
	return nil
}

func byWorkload(uid string) func(proxylog.Record) bool {
	return func(r proxylog.Record) bool { return r.Workload == uid }
}

func isAdd(uid string) func(proxylog.Record) bool {
	return func(r proxylog.Record) bool { return r.Event == "add" && (uid == "" || r.Workload == uid) }
}

func isDel(uid string) func(proxylog.Record) bool {
	return func(r proxylog.Record) bool { return r.Event == "del" && r.Workload == uid }
}

// isConn matches a connection record; empty arguments match any.
func isConn(listener, srcIP, origDst, uid string) func(proxylog.Record) bool {
	return func(r proxylog.Record) bool {
		return r.Event == "conn" && (listener == "" || r.Listener == listener) &&
			(srcIP == "" || strings.HasPrefix(r.Src, srcIP+":")) && (origDst == "" || r.OrigDst == origDst) &&
			(uid == "" || r.Workload == uid)
	}
}

// probeSNAT is the packets the app node's host rule gave the probe address
// (ISTIO_POSTRT's SNAT counters, in whichever iptables has it), -1 when
// none has the chain.
func (a *ambient) probeSNAT() int {
	for _, cmd := range []string{"iptables", "iptables-legacy"} {
		out, err := a.app.Command(cmd, "-t", "nat", "-L", "ISTIO_POSTRT", "-n", "-v", "-x").Output()
		if err != nil {
			continue
		}
		n := 0
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			if len(f) > 2 && strings.Contains(l, "SNAT") {
				var v int
				fmt.Sscan(f[0], &v)
				n += v
			}
		}
		return n
	}
	return -1
}

func (a *ambient) probeSet() (string, error) {
	out, err := a.app.Command("ipset", "list", "istio-inpod-probes-v4").Output()
	return string(out), err
}

func (a *ambient) probeSetHas(ip string) error {
	out, err := a.probeSet()
	if err != nil {
		return err
	}
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(ip) + `( |$)`).MatchString(out) {
		return fmt.Errorf("%s is not in istio-inpod-probes-v4:\n%s", ip, out)
	}
	return nil
}

// probeSetEmpty: the probe set is there, with no member.
func (a *ambient) probeSetEmpty() error {
	out, err := a.probeSet()
	if err != nil {
		return err
	}
	_, members, _ := strings.Cut(out, "Members:")
	if strings.TrimSpace(members) != "" {
		return fmt.Errorf("members left: %s", strings.TrimSpace(members))
	}
	return nil
}

// ambientGone: what ambient mode puts on a node (the chain of the probe
// rule, the probe sets) is not there.
func (a *ambient) ambientGone(n framework.Node) error {
	var left []string
	for _, cmd := range []string{"iptables", "iptables-legacy"} {
		if out, err := n.Command(cmd, "-t", "nat", "-S").Output(); err == nil {
			for _, l := range strings.Split(string(out), "\n") {
				if strings.HasPrefix(l, "-N ISTIO_") {
					left = append(left, cmd+" "+l)
				}
			}
		}
	}
	out, _ := n.Command("ipset", "list", "-n").Output()
	for _, l := range strings.Fields(string(out)) {
		if strings.HasPrefix(l, "istio-inpod-probes-") {
			left = append(left, "ipset "+l)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("left: %s", strings.Join(left, ", "))
	}
	return nil
}

// noRecords: no file under the node's records of pods and enrolled pods.
func (a *ambient) noRecords(n framework.Node) error {
	var left []string
	for _, d := range []string{"meshwire/pods", "meshwire/ambient"} {
		_ = filepath.WalkDir(filepath.Join(n.VarLibCNI, d), func(p string, e os.DirEntry, err error) error {
			if err == nil && !e.IsDir() {
				left = append(left, p)
			}
			return nil
		})
	}
	if len(left) > 0 {
		return fmt.Errorf("%d files left: %s", len(left), strings.Join(left, ", "))
	}
	return nil
}

// addAnswered: the intercept plugin's ADD of the pod (its sandbox, as the
// pod's record on the node names it, with the agent's enrollment in it)
// logged the agent's answer "enrolled".
func (a *ambient) addAnswered(uid string) error {
	store := podstate.New(nodelayout.At(filepath.Join(a.app.VarLibCNI, "meshwire")))
	recs, err := store.List()
	if err != nil {
		return err
	}
	var cid string
	for _, r := range recs {
		if r.UID == uid && r.Ambient != nil {
			cid = r.ContainerID
			break
		}
	}
	if cid == "" {
		return fmt.Errorf("no record in %s names pod %s enrolled", store.Dir(), uid)
	}
	log, err := os.ReadFile(a.app.PluginLog)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(log), "\n") {
		var r struct {
			ContainerID string `json:"containerID"`
			Command     string `json:"command"`
			Answer      string `json:"answer"`
		}
		if json.Unmarshal([]byte(line), &r) == nil && r.ContainerID == cid && r.Command == "ADD" && r.Answer == "enrolled" {
			return nil
		}
	}
	return fmt.Errorf("no ADD of sandbox %.12s logged the answer enrolled in %s", cid, a.app.PluginLog)
}
