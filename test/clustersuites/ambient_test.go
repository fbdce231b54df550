//go:build cluster

package clustersuites

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
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

	ambientpkg "github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podstate"
	"github.com/meshwire/meshwire/internal/proxylog"
	"github.com/meshwire/meshwire/internal/ruleset"
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
	cliUID string
	// fams are the addresses of each family the cluster has: IPv4's
	// first, and IPv6's on a dual-stack cluster.
	fams []family
}

// family is the app's, its client's and its Service's addresses of one
// address family.
type family struct{ app, cli, svc string }

// inbound matches the stand-in's record of the client's connection to
// the app over f.
func (f family) inbound(uid string) func(proxylog.Record) bool {
	return isConn("inbound", f.cli, net.JoinHostPort(f.app, "8080"), uid)
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
// record. On a dual-stack cluster the agent installs the IPv6 rules too
// (--ambient-ipv6, as istio-cni's chart does by default), the app's
// Service is RequireDualStack, and every client request is made over
// IPv6 as well (to the Service's IPv6 ClusterIP: the app sees the
// client's IPv6 address, the stand-in the app's IPv6 address as the
// original destination), as are the sidecar pod's and the app's calls to
// each other.
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
	var v4 family
	a.appUID, v4.app = a.pod(ambNS, "app")
	a.cliUID, v4.cli = a.pod(ambClientNS, "client")
	svc, err := c.Client.CoreV1().Services(ambNS).Get(ctx, "app", metav1.GetOptions{})
	framework.Must(t, "Service app", err)
	v4.svc = svc.Spec.ClusterIP
	a.fams = []family{v4}
	if c.Family() == "dual" {
		v6 := family{a.podIPv6(ambNS, "app"), a.podIPv6(ambClientNS, "client"), framework.IPv6(svc.Spec.ClusterIPs)}
		framework.Require(t, "3. the app, the client and the Service have IPv6 addresses (dual stack)",
			nonEmpty("app", v6.app, "client", v6.cli, "Service app (RequireDualStack)", v6.svc))
		a.fams = append(a.fams, v6)
	}
	t.Logf("app (uid %s) on %s, client (uid %s) on %s; app, client and Service addresses %+v", a.appUID, a.app.Name, a.cliUID, a.client.Name, a.fams)
	time.Sleep(2 * time.Second)
	framework.Check(t, "3. not labeled: no pod enrolled (metric 0)", framework.MetricIs(ctx, a.app, "meshwire_ambient_enrolled_pods", 0)())
	framework.Check(t, "3. not labeled: the stand-in got no pod (no add)", a.ztNone("", isAdd("")))
	for _, f := range a.fams {
		framework.Check(t, "3. client -> Service "+f.svc+": the app answered directly", a.clientGets(f))
	}
	framework.Check(t, "3. no such connection went through the stand-in", a.ztNone("", isConn("", "", "", "")))

	t.Log("4. label namespace " + ambNS + " " + ambLabel + "=ambient")
	snat0 := a.probeSNAT()
	bad0 := a.unhealthy(ambNS, "app")
	a.label(ambNS, "ambient")
	framework.Eventually(t, "4. the running app enrolled (metric 1)", 30*time.Second, framework.MetricIs(ctx, a.app, "meshwire_ambient_enrolled_pods", 1))
	framework.Check(t, "4. ... found through its processes: it started before ambient mode, with no record",
		a.agentSays(a.app, "pod "+ambNS+"/app started before ambient mode was on: recorded from its processes"))
	framework.Eventually(t, "4. the stand-in got the app (add, uid "+a.appUID+")", 30*time.Second, func() error { return a.ztHas("", isAdd(a.appUID)) })
	for _, f := range a.fams {
		framework.Check(t, "4. the app's address "+f.app+" is in its node's probe set", a.probeSetHas(f.app))
		framework.Check(t, "4. client -> Service "+f.svc+": answered, the app saw the client's own address "+f.cli, a.clientGets(f))
		framework.Check(t, "4. that connection went through the stand-in's inbound listener (orig_dst "+net.JoinHostPort(f.app, "8080")+")",
			a.ztHas("", f.inbound(a.appUID)))
	}
	framework.Check(t, "4. the client (other namespace, other node) is not captured: no stand-in has anything of it", a.ztNoneAnywhere(a.cliUID))
	out, err := c.Exec(ctx, ambNS, "app", "app", "curl", "-sk", "-m", "10", "https://"+apiService+"/healthz")
	framework.Check(t, "4. app -> kubernetes Service https://"+apiService+"/healthz", answers(strings.TrimSpace(out), err, "ok"))
	framework.Check(t, "4. the app's outbound connection went through the stand-in's 15001 (orig_dst "+apiService+":443)",
		a.ztHas("", isConn("outbound", v4.app, apiService+":443", a.appUID)))
	t.Log("4. the app's readiness probe (every 2 s, one failure makes it NotReady) for 12 s")
	time.Sleep(12 * time.Second)
	framework.Check(t, "4. the app stayed Ready", podReady(ctx, c, ambNS, "app")())
	framework.Checkf(t, "4. no failed probe of the app since its enrollment", a.unhealthy(ambNS, "app") == bad0,
		"kubelet's probes of the app failed (%d Unhealthy events before, %d now)", bad0, a.unhealthy(ambNS, "app"))
	snat := a.probeSNAT()
	framework.Checkf(t, "4. kubelet's probes left the node as 169.254.7.127 (ISTIO_POSTRT's SNAT)", snat0 >= 0 && snat > snat0,
		"%d packets before, %d now", snat0, snat)
	all := a.ztCount("", func(r proxylog.Record) bool { return r.Listener == "inbound" && r.Workload == a.appUID })
	client := a.ztCount("", func(r proxylog.Record) bool {
		for _, f := range a.fams {
			if f.inbound(a.appUID)(r) {
				return true
			}
		}
		return false
	})
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
	for _, f := range a.fams {
		framework.Check(t, "8. client -> Service "+f.svc+" after the restart: answered", a.clientGets(f))
		framework.Check(t, "8. ... through the new stand-in's inbound listener", a.ztHas(zt, f.inbound(a.appUID)))
	}
	framework.Check(t, "8. the app is still Ready", podReady(ctx, c, ambNS, "app")())

	t.Log("7. remove the label from namespace " + ambNS)
	a.label(ambNS, "")
	framework.Eventually(t, "7. every pod unenrolled (metric 0)", 30*time.Second, framework.MetricIs(ctx, a.app, "meshwire_ambient_enrolled_pods", 0))
	for _, uid := range []string{a.appUID, lateUID, annotatedUID} {
		framework.Eventually(t, "7. the stand-in was told: del "+uid, 30*time.Second, func() error { return a.ztHas(zt, isDel(uid)) })
	}
	framework.Check(t, "7. the probe set is empty", a.probeSetEmpty())
	n0 := a.ztCount(zt, isConn("", "", "", ""))
	for _, f := range a.fams {
		framework.Check(t, "7. client -> Service "+f.svc+": answered", a.clientGets(f))
	}
	out, err = c.Exec(ctx, ambNS, "app", "app", "curl", "-sk", "-m", "10", "https://"+apiService+"/healthz")
	framework.Check(t, "7. app -> kubernetes Service", answers(strings.TrimSpace(out), err, "ok"))
	n := a.ztCount(zt, isConn("", "", "", ""))
	framework.Checkf(t, "7. ... all directly: the stand-in saw no connection", n0 > 0 && n == n0, "%d stand-in connections before, %d after", n0, n)
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

	// Each family's addresses of the sidecar's end: the sidecar pod's,
	// its Service's and its passthrough address (the app's are a.fams).
	type end struct{ side, ssvc, passthrough string }
	ends := []end{{side.Status.PodIP, ssvc.Spec.ClusterIP, passthrough4}}
	// By the Services' names, over the family the resolver picks; in
	// dual stack, each family by the Services' addresses too.
	type call struct {
		appHost, sideHost string // the URL hosts of the app's and the sidecar pod's Services
		fams              []int  // the families (of ends and a.fams) the calls may take
	}
	calls := []call{{"app." + ambNS, "app-redirect." + ambMeshNS, []int{0}}}
	if len(a.fams) > 1 {
		e := end{framework.PodIPv6(&side), framework.IPv6(ssvc.Spec.ClusterIPs), passthrough6}
		framework.Require(t, "9. the sidecar pod and its Service have IPv6 addresses (dual stack)",
			nonEmpty("the sidecar pod", e.side, "Service app-redirect (RequireDualStack)", e.ssvc))
		ends = append(ends, e)
		calls = []call{{"app." + ambNS, "app-redirect." + ambMeshNS, []int{0, 1}},
			{a.fams[0].svc, ends[0].ssvc, []int{0}}, {"[" + a.fams[1].svc + "]", "[" + e.ssvc + "]", []int{1}}}
	}
	// pick is the family, among fams, whose address of what the app saw
	// (of) the reply names.
	pick := func(reply string, err error, whose string, fams []int, of func(int) string) (int, error) {
		addrs := make([]string, len(fams))
		for i, f := range fams {
			addrs[i] = of(f)
		}
		i, err := answeredFrom(reply, err, whose, addrs...)
		return fams[i], err
	}
	for _, l := range calls {
		out, err := c.Exec(ctx, ambMeshNS, side.Name, "app", "curl", "-gsS", "-m", "10", "http://"+l.appHost+"/clientip")
		i, err := pick(strings.TrimSpace(out), err, "the sidecar pod's", l.fams, func(i int) string { return ends[i].side })
		framework.Check(t, "9. sidecar pod ("+a.client.Name+") -> ambient app ("+a.app.Name+") via "+l.appHost+": answered, from the sidecar pod's address "+ends[i].side, err)
		svcDst := net.JoinHostPort(a.fams[i].svc, "80")
		framework.Check(t, "9. ... through the sidecar's outbound listener (orig_dst "+svcDst+")", countAtLeast(a.c, ctx, ambMeshNS, side.Name, func(r proxylog.Record) bool {
			return r.Event == "conn" && r.Listener == "outbound" && r.OrigDst == svcDst
		}))
		framework.Check(t, "9. ... and the app's stand-in's inbound listener", a.ztHas("", isConn("inbound", ends[i].side, net.JoinHostPort(a.fams[i].app, "8080"), a.appUID)))

		out, err = c.Exec(ctx, ambNS, "app", "app", "curl", "-gsS", "-m", "10", "http://"+l.sideHost+"/clientip")
		i, err = pick(strings.TrimSpace(out), err, "the sidecar's", l.fams, func(i int) string { return ends[i].passthrough })
		framework.Check(t, "9. ambient app -> sidecar pod via "+l.sideHost+": answered through the sidecar's inbound listener ("+ends[i].passthrough+")", err)
		ssvcDst := net.JoinHostPort(ends[i].ssvc, "80")
		framework.Check(t, "9. ... the app's connection went through its stand-in's outbound listener (orig_dst "+ssvcDst+")",
			a.ztHas("", isConn("outbound", a.fams[i].app, ssvcDst, a.appUID)))
	}
}

// nonEmpty is nil when every value of the name, value pairs is set, else
// an error naming those that are not.
func nonEmpty(pairs ...string) error {
	var missing []string
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] == "" {
			missing = append(missing, pairs[i])
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("none for %s", strings.Join(missing, ", "))
	}
	return nil
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

// podIPv6 is the pod's IPv6 address, "" when it has none.
func (a *ambient) podIPv6(ns, name string) string {
	p, err := a.c.Client.CoreV1().Pods(ns).Get(a.ctx, name, metav1.GetOptions{})
	framework.Must(a.t, "pod "+ns+"/"+name, err)
	return framework.PodIPv6(p)
}

// clientGets: the client's request for the app's /clientip through the
// app's Service's address of f answered with the client's own address of
// f (the stand-in keeps it).
func (a *ambient) clientGets(f family) error {
	reply, err := get(a.ctx, a.c, ambClientNS, "client", "client", "http://"+net.JoinHostPort(f.svc, "80")+"/clientip")
	_, err = answeredFrom(reply, err, "the client's", f.cli)
	return err
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
// when given and --ambient-ipv6 on a dual-stack cluster (istio-cni's
// chart turns the IPv6 rules on by default, ambient.ipv6), or off with
// all its flags, in meshwire's DaemonSet (the rest of its command as up
// installed it), rolled out on every node.
func setAmbient(t *testing.T, ctx context.Context, c *framework.Cluster, on bool, flags ...string) {
	var want []string
	if on {
		want = append([]string{"--ambient"}, flags...)
		if c.Family() == "dual" && !slices.Contains(want, "--ambient-ipv6") {
			want = append(want, "--ambient-ipv6")
		}
	}
	setAgentFlags(t, ctx, c, func(arg string) bool { return arg == "--ambient" || strings.HasPrefix(arg, "--ambient-") }, want)
}

// setAgentFlag adds or removes one flag of the agent's.
func setAgentFlag(t *testing.T, ctx context.Context, c *framework.Cluster, flag string, on bool) {
	var want []string
	if on {
		want = []string{flag}
	}
	setAgentFlags(t, ctx, c, func(arg string) bool { return arg == flag }, want)
}

// setAgentFlags removes the arguments drop matches that are not in want
// from meshwire's DaemonSet's command and adds those of want it lacks,
// rolled out on every node, every node Ready after it (nothing when the
// command stays the same).
func setAgentFlags(t *testing.T, ctx context.Context, c *framework.Cluster, drop func(string) bool, want []string) {
	dsc := c.Client.AppsV1().DaemonSets("kube-system")
	ds, err := dsc.Get(ctx, "meshwire-node", metav1.GetOptions{})
	framework.Must(t, "meshwire's DaemonSet", err)
	cmd := ds.Spec.Template.Spec.Containers[0].Command
	var next []string
	for _, arg := range cmd {
		if !drop(arg) || slices.Contains(want, arg) {
			next = append(next, arg)
		}
	}
	for _, w := range want {
		if !slices.Contains(next, w) {
			next = append(next, w)
		}
	}
	if slices.Equal(next, cmd) {
		return
	}
	ds.Spec.Template.Spec.Containers[0].Command = next
	_, err = dsc.Update(ctx, ds, metav1.UpdateOptions{})
	framework.Must(t, fmt.Sprintf("meshwire's DaemonSet's command %q", next), err)
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
			(srcIP == "" || strings.HasPrefix(r.Src, net.JoinHostPort(srcIP, ""))) && (origDst == "" || r.OrigDst == origDst) &&
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

// probeSet lists the app node's probe set of the family of the address
// ip: istio-inpod-probes-v4, or -v6.
func (a *ambient) probeSet(ip string) (string, error) {
	f := ruleset.V4
	if addr, err := netip.ParseAddr(ip); err == nil && addr.Is6() {
		f = ruleset.V6
	}
	out, err := a.app.Command("ipset", "list", ambientpkg.ProbeSetName(f)).Output()
	return string(out), err
}

func (a *ambient) probeSetHas(ip string) error {
	out, err := a.probeSet(ip)
	if err != nil {
		return err
	}
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(ip) + `( |$)`).MatchString(out) {
		return fmt.Errorf("%s is not in the probe set:\n%s", ip, out)
	}
	return nil
}

// probeSetEmpty: the probe set of each of the cluster's families is
// there, with no member.
func (a *ambient) probeSetEmpty() error {
	for _, f := range a.fams {
		out, err := a.probeSet(f.app)
		if err != nil {
			return err
		}
		_, members, _ := strings.Cut(out, "Members:")
		if strings.TrimSpace(members) != "" {
			return fmt.Errorf("members left: %s", strings.TrimSpace(members))
		}
	}
	return nil
}

// ambientGone: what ambient mode puts on a node (the chain of the probe
// rule, the probe sets) is not there.
func (a *ambient) ambientGone(n framework.Node) error {
	var left []string
	for _, cmd := range []string{"iptables", "iptables-legacy", "ip6tables", "ip6tables-legacy"} {
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
