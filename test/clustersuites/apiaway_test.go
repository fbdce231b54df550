//go:build cluster

package clustersuites

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

const (
	apiAwayNS   = "mwk-apiaway"
	apiAwayPods = 10
	// apiAwayFor is how long kube-apiserver stays stopped.
	apiAwayFor = 60 * time.Second
	// apiAwayGate is the hostPath file each pod mounts: kubelet holds the
	// sandboxes back until it exists.
	apiAwayGate = "/run/meshwire-apiaway.gate"
)

// APIAwayResult is one network's outage, as the report keeps it.
type APIAwayResult struct {
	Network string `json:"network"`
	Pods    int    `json:"pods"`
	// NetworkedAway: sandboxes the runtime reported ready (their network
	// set up) before kube-apiserver came back; WithRules: of those, the
	// ones whose network namespace held Istio's REDIRECT rules.
	NetworkedAway int `json:"networkedAway"`
	WithRules     int `json:"withRules"`
	// Sandbox calls (RunPodSandbox, from containerd's log) until every pod
	// was Ready: all, failed, and the successful ones that took over 5 s.
	Calls  int `json:"calls"`
	Failed int `json:"failed"`
	Waited int `json:"waited"`
	// SlowestMS is the longest successful RunPodSandbox.
	SlowestMS float64 `json:"slowestMS"`
	// FirstErr is the first failed call's error.
	FirstErr string `json:"firstErr,omitempty"`
	// ReadyAfterMS is the time from kube-apiserver's start to every pod
	// Ready; -1 if they never were.
	ReadyAfterMS float64 `json:"readyAfterMS"`
}

// TestAPIServerAway (one node): 10 sidecar pods (REDIRECT, the shape
// istio-cni acts on) bound to the node, kube-apiserver stopped for 60 s
// just as kubelet starts their sandboxes (a hostPath gate holds them back
// until the API server is gone), on a fresh cluster per network
// (APIAWAY_LEGS, "meshwire istio-cni"). Reported per network: the
// sandboxes that got their network while the API server was away, and
// their rules; the sandbox calls that failed or waited (containerd's log);
// the time from the API server's return to every pod Ready. Judged on
// meshwire: every sandbox networked, with Istio's rules, while the API
// server is away, and no sandbox call failed. istio-cni's plugin GETs the
// pod from the API server on every ADD: its figures are reported.
func TestAPIServerAway(t *testing.T) {
	repo, err := filepath.Abs("../..")
	framework.Must(t, "the repository", err)
	life := framework.Lifecycle{Repo: repo, Nodes: 1, Logs: reportDir("apiaway", "lifecycle")}
	var results []APIAwayResult
	nets := legs("APIAWAY_LEGS", "meshwire", "istio-cni")
	framework.Require(t, "a network to run on (APIAWAY_LEGS)", checkf(len(nets) > 0, "APIAWAY_LEGS names none"))
	for _, cni := range nets {
		res := apiAway(t, clusterOf(t, life, cni))
		results = append(results, res)
		b, _ := json.MarshalIndent(res, "", "  ")
		_ = os.WriteFile(reportDir("apiaway", cni+".json"), b, 0o644)
		framework.Check(t, cni+": cluster down, its leak checks passed", life.Down(cni))
	}
	t.Logf("kube-apiserver stopped for %s as kubelet started %d sidecar pods' sandboxes:", apiAwayFor, apiAwayPods)
	t.Logf("| network | networked while away | with their rules | sandbox calls | failed | over 5 s | slowest | all Ready after the API server's return |")
	t.Logf("|---|---|---|---|---|---|---|---|")
	for _, r := range results {
		slowest, ready := "none succeeded", "not within 5 min"
		if r.Calls > r.Failed {
			slowest = fmt.Sprintf("%.1f s", r.SlowestMS/1000)
		}
		if r.ReadyAfterMS >= 0 {
			ready = fmt.Sprintf("%.1f s", r.ReadyAfterMS/1000)
		}
		t.Logf("| %s | %d/%d | %d | %d | %d | %d | %s | %s |", r.Network, r.NetworkedAway, r.Pods, r.WithRules,
			r.Calls, r.Failed, r.Waited, slowest, ready)
		if r.FirstErr != "" {
			t.Logf("%s: the first failed sandbox call: %s", r.Network, r.FirstErr)
		}
	}
}

// apiAway runs the outage on the running one-node cluster.
func apiAway(t *testing.T, c *framework.Cluster) APIAwayResult {
	ctx := context.Background()
	node := c.Nodes[0]
	res := APIAwayResult{Network: c.CNI, Pods: apiAwayPods, ReadyAfterMS: -1}
	fresh(t, ctx, c, apiAwayNS)
	gate := func(open bool) error {
		cmd := "rm -f " + apiAwayGate
		if open {
			cmd = "touch " + apiAwayGate
		}
		return node.Command("sh", "-c", cmd).Run()
	}
	framework.Must(t, "the gate closed", gate(false))
	t.Cleanup(func() { _ = gate(false) })
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: apiAwayNS}}, metav1.CreateOptions{})
	framework.Require(t, c.CNI+": namespace "+apiAwayNS, err)
	defer func() {
		framework.Check(t, c.CNI+": namespace "+apiAwayNS+" deleted", c.DeleteNamespace(ctx, apiAwayNS, 3*time.Minute))
	}()
	for i := 0; i < apiAwayPods; i++ {
		apply(t, ctx, c, "apiaway.yaml", map[string]string{"NAMESPACE": apiAwayNS, "NAME": fmt.Sprintf("away-%d", i), "NODE": node.Name, "GATE": apiAwayGate})
	}
	// Kubelet has each pod once it wrote the pod's first status (before it
	// mounts the volumes, the gate among them, and then runs the sandbox).
	framework.Require(t, c.CNI+": kubelet has every pod, waiting at the gate", framework.Poll(2*time.Minute, func() error {
		pods, err := c.Pods(ctx, apiAwayNS, "app=apiaway")
		if err != nil {
			return err
		}
		seen := 0
		for _, p := range pods {
			if len(p.Status.Conditions) > 0 {
				seen++
			}
		}
		if seen != apiAwayPods {
			return fmt.Errorf("kubelet wrote the status of %d of %d pods", seen, apiAwayPods)
		}
		return nil
	}))
	sbs, err := node.Sandboxes(ctx, apiAwayNS)
	framework.Require(t, c.CNI+": the node's sandboxes listed over CRI", err)
	framework.Require(t, c.CNI+": no sandbox before the gate opens", checkf(len(sbs) == 0, "%d sandboxes", len(sbs)))

	framework.Require(t, c.CNI+": kube-apiserver stopped", c.Control("stop", "kube-apiserver"))
	stopped := time.Now()
	restarted := false
	restart := func() {
		if !restarted {
			restarted = true
			framework.Check(t, c.CNI+": kube-apiserver started again", c.Control("start", "kube-apiserver"))
		}
	}
	t.Cleanup(restart) // a failed check must not leave the cluster without its API server
	framework.Must(t, "the gate opened", gate(true))
	t.Logf("%s: kube-apiserver stopped, the gate open: kubelet runs the sandboxes", c.CNI)
	readyAt := map[string]time.Duration{}
	for time.Since(stopped) < apiAwayFor {
		time.Sleep(time.Second)
		sbs, err = node.Sandboxes(ctx, apiAwayNS)
		if err != nil {
			continue
		}
		for _, s := range sbs {
			if _, ok := readyAt[s.Pod]; s.Ready && !ok {
				readyAt[s.Pod] = time.Since(stopped)
			}
		}
	}
	// The last listing, still without the API server: each ready
	// sandbox's rules, read from its network namespace.
	sbs, err = node.Sandboxes(ctx, apiAwayNS)
	framework.Check(t, c.CNI+": the sandboxes listed before the API server returns", err)
	networked := map[string]bool{}
	for _, s := range sbs {
		if !s.Ready || s.IP == "" || networked[s.Pod] {
			continue
		}
		networked[s.Pod] = true
		rules, err := node.RulesAt(s.IP)
		if err == nil && (strings.Contains(rules, "-j ISTIO_REDIRECT") || strings.Contains(rules, "jump ISTIO_REDIRECT")) {
			res.WithRules++
		}
	}
	res.NetworkedAway = len(networked)
	var at []string
	for p, d := range readyAt {
		at = append(at, fmt.Sprintf("%s %.1fs", p, d.Seconds()))
	}
	sort.Strings(at)
	t.Logf("%s: sandboxes ready while the API server was away (time since it stopped): %s", c.CNI, strings.Join(at, ", "))
	restart()
	back := time.Now()
	framework.Require(t, c.CNI+": kube-apiserver ready again", framework.Poll(2*time.Minute, func() error {
		_, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}))
	if _, err := c.WaitReady(ctx, apiAwayNS, "app=apiaway", apiAwayPods, 5*time.Minute); framework.Check(t, c.CNI+": every pod Ready after the API server's return", err) {
		res.ReadyAfterMS = float64(time.Since(back).Milliseconds())
	}
	calls, err := node.SandboxCalls(apiAwayNS)
	framework.Check(t, c.CNI+": containerd's sandbox calls read", err)
	for _, call := range calls {
		res.Calls++
		switch {
		case call.Err != "":
			res.Failed++
			if res.FirstErr == "" {
				res.FirstErr = call.Err
			}
		case !call.End.IsZero():
			d := call.End.Sub(call.Start)
			if d > 5*time.Second {
				res.Waited++
			}
			res.SlowestMS = max(res.SlowestMS, float64(d.Milliseconds()))
		}
	}
	if c.CNI == "meshwire" {
		framework.Checkf(t, "meshwire: every sandbox got its network while the API server was away", res.NetworkedAway == apiAwayPods,
			"%d of %d", res.NetworkedAway, apiAwayPods)
		framework.Checkf(t, "meshwire: each with Istio's REDIRECT rules", res.WithRules == res.NetworkedAway,
			"%d of %d", res.WithRules, res.NetworkedAway)
		framework.Checkf(t, "meshwire: no sandbox call failed", res.Failed == 0, "%d failed, the first: %s", res.Failed, res.FirstErr)
	}
	return res
}

// checkf is nil when ok, else the error format makes.
func checkf(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf(format, args...)
}
