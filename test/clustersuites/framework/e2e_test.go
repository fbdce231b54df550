package framework

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const junit = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5" disabled="3" errors="0" failures="1" time="10">
  <testsuite name="Kubernetes e2e suite" package="/" tests="5" disabled="0" skipped="2" errors="0" failures="1" time="10">
    <testcase name="[ReportBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="0"></testcase>
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1"></testcase>
    <testcase name="[ReportAfterSuite] Kubernetes e2e suite report" classname="Kubernetes e2e suite" status="passed" time="0"></testcase>
    <testcase name="[It] [sig-network] Services should serve a basic endpoint [Conformance]" classname="Kubernetes e2e suite" status="passed" time="3"></testcase>
    <testcase name="[It] [sig-network] DNS should provide DNS for services [Conformance]" classname="Kubernetes e2e suite" status="failed" time="3"><failure message="timed out" type="failed">x</failure></testcase>
    <testcase name="[It] [sig-network] Networking Granular Checks [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
    <testcase name="[It] [sig-network] Conntrack should be able to preserve UDP traffic" classname="Kubernetes e2e suite" status="passed" time="1"></testcase>
  </testsuite>
</testsuites>`

func writeRun(t *testing.T, xml, log string) string {
	d := t.TempDir()
	if err := os.WriteFile(filepath.Join(d, "junit_01.xml"), []byte(xml), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "e2e.log"), []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestE2EVerdict: a run is judged by the specs it ran, from the JUnit
// report: fewer than stated fails (a run of 0 specs most of all), and so
// does any failed spec; Ginkgo's suite nodes are not specs.
func TestE2EVerdict(t *testing.T) {
	r, err := ReadE2E(writeRun(t, junit, "Ran 3 of 7137 Specs in 10 seconds\nFAIL! -- 2 Passed | 1 Failed\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Ran() != 3 || r.Count("passed") != 2 || r.Count("failed") != 1 || r.Count("skipped") != 1 {
		t.Errorf("read %d ran, %d passed, %d failed, %d skipped; want 3, 2, 1, 1", r.Ran(), r.Count("passed"), r.Count("failed"), r.Count("skipped"))
	}
	if len(r.Summary) != 2 {
		t.Errorf("summary %q", r.Summary)
	}
	if err := E2EVerdict(r, 3); err == nil || !strings.Contains(err.Error(), "DNS should provide") {
		t.Errorf("a failed spec: %v", err)
	}
	empty, err := ReadE2E(writeRun(t, `<testsuites><testsuite tests="0"></testsuite></testsuites>`, "Ran 0 of 7137 Specs\nSUCCESS!\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := E2EVerdict(empty, 45); err == nil {
		t.Error("a run of 0 specs passed a suite that states 45")
	}
	if _, err := ReadE2E(t.TempDir()); err == nil {
		t.Error("a run without a JUnit report was read")
	}
}

// TestE2ECompare: what the control passes must pass; what fails on both is
// listed, not held against the run.
func TestE2ECompare(t *testing.T) {
	control := E2EResult{Specs: map[string]string{"a": "passed", "b": "failed", "c": "passed", "d": "skipped"}}
	run := E2EResult{Specs: map[string]string{"a": "passed", "b": "failed", "c": "passed", "d": "skipped"}}
	both, err := E2ECompare(run, control)
	if err != nil || len(both) != 1 || both[0] != "b" {
		t.Errorf("equal runs: %v, %v", both, err)
	}
	run.Specs["c"] = "failed"
	if _, err := E2ECompare(run, control); err == nil {
		t.Error("a spec the control passed failed, and the comparison passed")
	}
	delete(run.Specs, "c")
	if _, err := E2ECompare(run, control); err == nil || !strings.Contains(err.Error(), "not run") {
		t.Errorf("a spec the control passed did not run: %v", err)
	}
}

// TestFocusOn: the focus selects exactly the specs named, by what Ginkgo
// matches (the suite's description, a space, the spec's text: no "[It] "
// prefix), with their brackets and dots taken literally.
func TestFocusOn(t *testing.T) {
	named := []string{
		"[It] [sig-network] KubeProxy should set TCP CLOSE_WAIT timeout [Privileged]",
		"[It] [sig-network] Services should serve a basic endpoint from pods  [Conformance]",
	}
	focus := regexp.MustCompile(FocusOn(named))
	for _, text := range []string{
		"Kubernetes e2e suite [sig-network] KubeProxy should set TCP CLOSE_WAIT timeout [Privileged]",
		"Kubernetes e2e suite [sig-network] Services should serve a basic endpoint from pods  [Conformance]",
	} {
		if !focus.MatchString(text) {
			t.Errorf("the focus %q does not select %q", focus, text)
		}
	}
	for _, text := range []string{
		"Kubernetes e2e suite [sig-network] KubeProxy should set TCP CLOSE_WAIT timeout [Privileged] and more",
		"Kubernetes e2e suite [sig-network] KubeProxy should set TCP CLOSE_WAIT timeout P",
		"Kubernetes e2e suite [sig-network] Services should serve a basic endpoint from pods",
		"Kubernetes e2e suite x[sig-network] KubeProxy should set TCP CLOSE_WAIT timeout [Privileged]",
	} {
		if focus.MatchString(text) {
			t.Errorf("the focus %q selects %q", focus, text)
		}
	}
}
