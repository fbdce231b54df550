//go:build cluster

package clustersuites

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

// The e2e suites' focus, skip and the number of specs each must run, on
// Kubernetes v1.34.3 (e2e.test built by build.sh e2e).
const (
	// sig-network's conformance specs that may run beside others.
	conformanceFocus = `\[sig-network\].*\[Conformance\]`
	conformanceSkip  = `\[Serial\]|\[Disruptive\]`
	conformanceSpecs = 45
	// The broad suite: every sig-network spec but the feature-gated,
	// serial, disruptive and flaky ones, and the conformance specs, which
	// TestConformance runs (130 specs with them, 85 without).
	networkFocus = `\[sig-network\]`
	networkSkip  = `\[Feature:|\[Serial\]|\[Disruptive\]|\[Flaky\]|\[Conformance\]`
	// Dual stack (kubernetes/test/e2e/network/dual_stack.go): 23 specs select, of
	// which the SCTP one is skipped: this machine's kernel has no SCTP (a
	// socket of it fails with EPROTONOSUPPORT), for the control as for
	// meshwire.
	dualStackFocus = `\[Feature:IPv6DualStack\]`
	dualStackSkip  = `\[Feature:SCTPConnectivity\]`
)

// dualStackSpecs is how many dual-stack specs run: all 22 on two nodes or
// more; on one, the 9 that do not build on NewNetworkingTestConfig (the
// 13 Granular Checks left skip themselves below 2 nodes).
func dualStackSpecs(nodes int) int {
	if nodes >= 2 {
		return 22
	}
	return 9
}

// clusterFamily is the address families the suites that take clusters up
// ask for (MESHWIRE_CLUSTER_IP_FAMILY): ipv4 by default, or dual.
func clusterFamily() string {
	if f := os.Getenv("MESHWIRE_CLUSTER_IP_FAMILY"); f != "" {
		return f
	}
	return "ipv4"
}

// networkSpecs is how many specs the broad suite runs: of the 85 it
// selects, 76 ran on two nodes on 2026-11-28 (the 9 others skip
// themselves: 7 need zones, 1 the GCE provider, 1 three nodes). Other
// sizes are not stated yet (0, which fails the count).
func networkSpecs(nodes int) int {
	if nodes == 2 {
		return 76
	}
	return 0
}

func reportDir(parts ...string) string {
	root := os.Getenv("MESHWIRE_CLUSTER_E2E_REPORT")
	if root == "" {
		root = "/var/tmp/meshwire-cluster-e2e"
	}
	return filepath.Join(append([]string{root}, parts...)...)
}

// TestE2E runs Kubernetes' e2e suite against the running cluster:
// E2E_FOCUS and E2E_SKIP (sig-network's conformance by default) must run
// E2E_SPECS specs (45 for the default), none failing.
func TestE2E(t *testing.T) {
	c := framework.Load(t)
	focus, skip, want := conformanceFocus, conformanceSkip, conformanceSpecs
	if f := os.Getenv("E2E_FOCUS"); f != "" {
		focus, skip, want = f, os.Getenv("E2E_SKIP"), -1
	}
	if s := os.Getenv("E2E_SKIP"); s != "" {
		skip = s
	}
	if s := os.Getenv("E2E_SPECS"); s != "" {
		n, err := strconv.Atoi(s)
		framework.Must(t, "E2E_SPECS", err)
		want = n
	}
	if want < 0 {
		t.Fatalf("E2E_FOCUS %q: set E2E_SPECS, the number of specs it must run", focus)
	}
	dir := reportDir(c.CNI)
	t.Logf("e2e.test --ginkgo.focus %q --ginkgo.skip %q on %d node(s), %s, %d specs expected (report and log: %s)", focus, skip, len(c.Nodes), c.Family(), want, dir)
	r, err := c.RunE2E(context.Background(), focus, skip, dir)
	framework.Require(t, "e2e.test ran and reported", err)
	for _, l := range r.Summary {
		t.Log(l)
	}
	framework.Check(t, fmt.Sprintf("%d specs ran on %s, none failed", want, c.CNI), framework.E2EVerdict(r, want))
}

// TestConformance: sig-network's 45 conformance specs on a fresh cluster
// whose network is meshwire, then on a fresh one whose network is the
// reference plugins v1.9.1 (the control), each taken down with its leak
// checks; MESHWIRE_CLUSTER_NODES nodes (1 by default). Both must run 45
// specs; meshwire must pass every one (and so every one the control
// passes).
func TestConformance(t *testing.T) {
	compareWithControl(t, "conformance", conformanceFocus, conformanceSkip, conformanceSpecs, true, false)
}

// TestDualStack: Kubernetes' [Feature:IPv6DualStack] specs on a fresh
// dual-stack cluster whose network is meshwire, then on a fresh one whose
// network is the reference plugins v1.9.1 (the control), each taken down
// with its leak checks; MESHWIRE_CLUSTER_NODES nodes (1 by default).
// Both must run the number dualStackSpecs states; meshwire must pass
// every one.
func TestDualStack(t *testing.T) {
	if clusterFamily() != "dual" {
		t.Fatalf("MESHWIRE_CLUSTER_IP_FAMILY is %q: the dual-stack specs need dual (make cluster-dualstack sets it)", clusterFamily())
	}
	compareWithControl(t, "dualstack", dualStackFocus, dualStackSkip, dualStackSpecs(clusterNodes()), true, false)
}

// TestNetworkSuite: the broad sig-network suite, meshwire beside the
// control on fresh clusters: every spec that passes on the control must
// pass on meshwire; the specs that fail on both are listed. The control
// runs the specs that failed on meshwire, and only those: they are the
// ones the verdict needs (a spec meshwire passed meets the target
// whatever the control does), and the suite takes an hour per network.
func TestNetworkSuite(t *testing.T) {
	nodes := clusterNodes()
	want := networkSpecs(nodes)
	if s := os.Getenv("NETWORK_SUITE_SPECS"); s != "" {
		want, _ = strconv.Atoi(s)
	}
	compareWithControl(t, "network", networkFocus, networkSkip, want, false, true)
}

func clusterNodes() int {
	n, err := strconv.Atoi(os.Getenv("MESHWIRE_CLUSTER_NODES"))
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// compareWithControl runs the e2e suite on meshwire and on the control,
// fresh clusters each; a meshwire cluster of the same size and address
// families already running is used for the first leg, and started again
// at the end. With
// onFailures, the control runs only the specs that failed on meshwire
// (and not at all when none did).
func compareWithControl(t *testing.T, name, focus, skip string, want int, allPass, onFailures bool) {
	repo, err := filepath.Abs("../..")
	framework.Must(t, "the repository", err)
	nodes := clusterNodes()
	life := framework.Lifecycle{Repo: repo, Nodes: nodes, Logs: reportDir(name, "lifecycle")}
	t0 := time.Now()
	restore := false
	if c, ok := framework.Running(); ok {
		if c.CNI != "meshwire" || len(c.Nodes) != nodes || c.Family() != clusterFamily() {
			framework.Require(t, "the running cluster taken down", life.Down("running"))
		} else {
			restore = true
		}
	}
	results := map[string]framework.E2EResult{}
	suiteFocus := focus
	for _, cni := range []string{"meshwire", "reference"} {
		if cni == "reference" && onFailures {
			failed := results["meshwire"].With("failed")
			if len(failed) == 0 {
				t.Logf("the control: not run, meshwire failed no spec")
				results[cni] = framework.E2EResult{Summary: []string{"not run: meshwire failed no spec"}}
				break
			}
			focus = framework.FocusOn(failed)
		}
		if c, ok := framework.Running(); !ok || c.CNI != cni {
			framework.Require(t, cni+": cluster up", life.Up(cni, cni))
		}
		c := framework.Load(t)
		dir := reportDir(name, cni)
		_ = os.RemoveAll(dir)
		t.Logf("%s: e2e.test --ginkgo.focus %q --ginkgo.skip %q on %d node(s) (report and log: %s)", cni, focus, skip, len(c.Nodes), dir)
		r, err := c.RunE2E(context.Background(), focus, skip, dir)
		framework.Check(t, cni+": e2e.test ran and reported", err)
		results[cni] = r
		for _, l := range r.Summary {
			t.Logf("%s: %s", cni, l)
		}
		framework.Check(t, cni+": cluster down, its leak checks passed", life.Down(cni))
	}
	m, ref := results["meshwire"], results["reference"]
	switch {
	case onFailures:
		framework.Checkf(t, fmt.Sprintf("meshwire ran the %d specs stated", want), want > 0 && m.Ran() == want, "%d ran", m.Ran())
		framework.Checkf(t, "the control ran every spec meshwire failed", ref.Ran() == m.Count("failed"), "%d failed on meshwire, %d ran on the control", m.Count("failed"), ref.Ran())
	case want > 0:
		framework.Checkf(t, fmt.Sprintf("meshwire ran the %d specs stated", want), m.Ran() == want, "%d ran", m.Ran())
		framework.Checkf(t, fmt.Sprintf("the control ran the %d specs stated", want), ref.Ran() == want, "%d ran", ref.Ran())
	default:
		framework.Checkf(t, "both ran specs", m.Ran() > 0 && ref.Ran() > 0, "meshwire %d, the control %d", m.Ran(), ref.Ran())
	}
	if allPass {
		framework.Check(t, "meshwire passed every spec", framework.E2EVerdict(m, m.Ran()))
	}
	both, err := framework.E2ECompare(m, ref)
	framework.Check(t, "every spec the control passed passed on meshwire", err)
	summary := []string{fmt.Sprintf("%s, %s, Kubernetes v1.34.3, %d node(s), %s, focus %q, skip %q", name, time.Now().UTC().Format("2006-01-02"), nodes, clusterFamily(), suiteFocus, skip)}
	for _, cni := range []string{"meshwire", "reference"} {
		summary = append(summary, "", fmt.Sprintf("== %s (log: %s)", cni, results[cni].Log))
		summary = append(summary, results[cni].Summary...)
	}
	summary = append(summary, "", fmt.Sprintf("failed on both (%d):", len(both)))
	for _, s := range both {
		summary = append(summary, "  "+s)
	}
	if b, err := os.ReadFile(reportDir("leaks-reference.txt")); err == nil {
		summary = append(summary, "", "what the reference plugins left once every pod was gone (by design; down removes it):", strings.TrimSpace(string(b)))
	}
	summary = append(summary, "", fmt.Sprintf("took %s", time.Since(t0).Round(time.Second)))
	text := strings.Join(summary, "\n") + "\n"
	_ = os.WriteFile(reportDir(name, "summary.txt"), []byte(text), 0o644)
	t.Log("\n" + text)
	if restore {
		framework.Check(t, "the meshwire cluster started again", life.Up("meshwire", "restore"))
	}
}
