package framework

import (
	"strings"
	"testing"
	"time"
)

// auditLine is an audit.k8s.io/v1 event as kube-apiserver logs it at
// Metadata level.
func auditLine(id, stage, verb, user, ua, resource, sub, received string) string {
	ref := ""
	if resource != "" {
		ref = `,"objectRef":{"resource":"` + resource + `","subresource":"` + sub + `","namespace":"mwk-podstart","name":"ps-1-0","apiVersion":"v1"}`
	}
	return `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"` + id + `","stage":"` + stage +
		`","requestURI":"/api/v1/namespaces/mwk-podstart/pods/ps-1-0","verb":"` + verb + `","user":{"username":"` + user +
		`","groups":["system:authenticated"]},"sourceIPs":["198.18.192.1"],"userAgent":"` + ua + `"` + ref +
		`,"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"` + received +
		`","stageTimestamp":"` + received + `"}`
}

// TestCountAudit: requests counted once by auditID, by user agent's
// program and user, only when received in a window.
func TestCountAudit(t *testing.T) {
	w := []Window{{From: time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC), To: time.Date(2026, 11, 28, 10, 0, 10, 0, time.UTC)}}
	cni := "system:serviceaccount:istio-system:istio-cni"
	log := strings.Join([]string{
		auditLine("a", "ResponseComplete", "get", cni, "istio-cni/v0.0.0 (linux/amd64) kubernetes/$Format", "pods", "", "2026-11-28T10:00:01.000000Z"),
		auditLine("b", "ResponseComplete", "get", cni, "istio-cni/v0.0.0 (linux/amd64) kubernetes/$Format", "pods", "", "2026-11-28T10:00:02.000000Z"),
		// a watch: logged when it starts and when it ends, one request
		auditLine("c", "ResponseStarted", "watch", cni, "install-cni/1.30 (linux/amd64) kubernetes/abc", "pods", "", "2026-11-28T10:00:03.000000Z"),
		auditLine("c", "ResponseComplete", "watch", cni, "install-cni/1.30 (linux/amd64) kubernetes/abc", "pods", "", "2026-11-28T10:00:03.000000Z"),
		auditLine("d", "ResponseComplete", "patch", "system:node:n1", "kubelet/v1.34.3 (linux/amd64) kubernetes/f2b1c3d", "pods", "status", "2026-11-28T10:00:04.000000Z"),
		// outside the window
		auditLine("e", "ResponseComplete", "get", cni, "istio-cni/v0.0.0 (linux/amd64) kubernetes/$Format", "pods", "", "2026-11-28T10:00:11.000000Z"),
		auditLine("f", "ResponseComplete", "get", "admin", "", "", "", "2026-11-28T10:00:05.000000Z"),
		"",
	}, "\n")
	a, err := CountAudit(strings.NewReader(log), w)
	if err != nil {
		t.Fatal(err)
	}
	want := map[AuditKey]int{
		{"istio-cni", cni}:            2,
		{"install-cni", cni}:          1,
		{"kubelet", "system:node:n1"}: 1,
		{"(none)", "admin"}:           1,
	}
	if len(a.Requests) != len(want) {
		t.Errorf("callers %v, want %v", a.Requests, want)
	}
	for k, n := range want {
		if a.Requests[k] != n {
			t.Errorf("%v: %d requests, want %d", k, a.Requests[k], n)
		}
	}
	if n := a.Calls[AuditKey{"kubelet", "system:node:n1"}]["patch pods/status"]; n != 1 {
		t.Errorf("kubelet's patch pods/status: %d", n)
	}
	if n := a.Total(func(k AuditKey) bool { return k.Program == "istio-cni" }); n != 2 {
		t.Errorf("istio-cni's total: %d", n)
	}
	sum := a.Add(a)
	if n := sum.Requests[AuditKey{"istio-cni", cni}]; n != 4 {
		t.Errorf("added: %d", n)
	}
	table := AuditTable(sum, 4, func(k AuditKey) bool { return k.Program == "istio-cni" })
	if !strings.Contains(table, "| istio-cni (judged) | "+cni+" | 4 | 1.00 | get pods 4 |") || !strings.Contains(table, "| all | | 10 | 2.50 | |") {
		t.Errorf("table:\n%s", table)
	}
	if _, err := CountAudit(strings.NewReader("not json\n"), w); err == nil {
		t.Error("a line that is no event was taken")
	}
	var zero AuditCounts
	if n := zero.Add(a).Total(func(AuditKey) bool { return true }); n != 5 {
		t.Errorf("zero plus a: %d", n)
	}
}

func TestUserAgentProgram(t *testing.T) {
	for ua, want := range map[string]string{
		"kubelet/v1.34.3 (linux/amd64) kubernetes/f2b1c3d":                                                                         "kubelet",
		"kube-controller-manager/v1.34.3 (linux/amd64) kubernetes/f2b1c3d/system:serviceaccount:kube-system:replicaset-controller": "kube-controller-manager",
		"meshwire/v0.0.0 (linux/amd64) kubernetes/$Format/meshwire-node":                                                           "meshwire",
		"curl 8.0":  "curl",
		"":          "(none)",
		"istio-cni": "istio-cni",
	} {
		if got := UserAgentProgram(ua); got != want {
			t.Errorf("%q: %q, want %q", ua, got, want)
		}
	}
}
