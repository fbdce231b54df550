package framework

import (
	"strings"
	"testing"
	"time"
)

var addWindow = []Window{{From: time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC), To: time.Date(2026, 11, 28, 10, 0, 10, 0, time.UTC)}}

// TestInterceptAddTimes: an intercept ADD that installed rules counts
// with its done record's duration; one that did not intercept the pod,
// another plugin's, a DEL and one outside the window do not.
func TestInterceptAddTimes(t *testing.T) {
	rec := func(at, msg, plugin, cmd, cid, extra string) string {
		return `{"time":"2026-11-28T10:00:0` + at + `Z","level":"INFO","msg":"` + msg + `","plugin":"` + plugin + `","command":"` + cmd +
			`","containerID":"` + cid + `","netns":"/var/run/netns/cni-x","ifname":"eth0"` + extra + `}`
	}
	log := strings.Join([]string{
		rec("1.000", "interception rules installed", "intercept", "ADD", "a", `,"why":"istio sidecar","mode":"REDIRECT"`),
		rec("2.000", "pod not intercepted", "intercept", "ADD", "b", `,"why":"no sidecar"`),
		rec("1.003", "done", "intercept", "ADD", "a", `,"durationMs":3.25,"cpuMs":2`),
		rec("2.001", "done", "intercept", "ADD", "b", `,"durationMs":0.5,"cpuMs":1`),
		rec("3.000", "done", "bridge", "ADD", "a", `,"durationMs":20,"cpuMs":5`),
		rec("4.000", "interception rules installed", "intercept", "CHECK", "a", ``),
		rec("4.001", "done", "intercept", "CHECK", "a", `,"durationMs":1,"cpuMs":1`),
		`{"time":"2026-11-28T10:00:11Z","level":"INFO","msg":"interception rules installed","plugin":"intercept","command":"ADD","containerID":"c"}`,
		`{"time":"2026-11-28T10:00:11.004Z","level":"INFO","msg":"done","plugin":"intercept","command":"ADD","containerID":"c","durationMs":4}`,
		"not json",
	}, "\n")
	got, err := InterceptAddTimes(strings.NewReader(log), addWindow)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["a"] != 3.25 {
		t.Errorf("got %v, want a: 3.25", got)
	}
}

// TestIstioCNIAddTimes: from a pod's Start line to its End line, both in
// the window, pods interleaved as parallel ADDs write them.
func TestIstioCNIAddTimes(t *testing.T) {
	line := func(at, msg string) string {
		return `{"level":"info","time":"2026-11-28T10:00:` + at + `Z","scope":"default","msg":"` + msg + `"}`
	}
	log := strings.Join([]string{
		line("01.000000", "============= Start iptables configuration for ps-1-0 ============="),
		line("01.001000", "============= Start iptables configuration for ps-1-1 ============="),
		line("01.010000", "Running iptables-restore with the following input:"),
		line("01.020500", "============= End iptables configuration for ps-1-0 ============="),
		line("01.031000", "============= End iptables configuration for ps-1-1 ============="),
		line("09.990000", "============= Start iptables configuration for ps-1-2 ============="),
		line("10.010000", "============= End iptables configuration for ps-1-2 ============="),
		line("02.000000", "============= End iptables configuration for ps-9-9 ============="),
	}, "\n")
	got, err := IstioCNIAddTimes(strings.NewReader(log), addWindow)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["ps-1-0"] != 20.5 || got["ps-1-1"] != 30 {
		t.Errorf("got %v, want ps-1-0: 20.5, ps-1-1: 30", got)
	}
}

// TestCompareTimes: ratios against their targets, and nothing measured.
func TestCompareTimes(t *testing.T) {
	a, b := []float64{1, 2, 3, 4}, []float64{10, 10, 10, 10}
	if table, err := CompareTimes("ADD", "m", a, "i", b, []PodStartTarget{{50, 0.3}, {99, 0.4}}); err != nil {
		t.Errorf("p50 0.2x, p99 0.4x within 0.3x and 0.4x: %v\n%s", err, table)
	}
	table, err := CompareTimes("ADD", "m", a, "i", b, []PodStartTarget{{99, 0.3}})
	if err == nil || !strings.Contains(err.Error(), "p99 0.40x") || !strings.Contains(table, "**missed**") {
		t.Errorf("p99 0.4x against 0.3x: %v\n%s", err, table)
	}
	if _, err := CompareTimes("ADD", "m", nil, "i", b, []PodStartTarget{{50, 0.3}}); err == nil {
		t.Error("nothing measured passed")
	}
}
