package framework

import (
	"strings"
	"testing"
	"time"
)

// containerd's own lines (v1.6 and v2.4 print them alike), one call that
// failed (istio-cni's ADD with the API server away), its retry that
// succeeded, another namespace's call, and one still running.
const containerdLog = `time="2026-11-29T01:00:00.100000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:away-0,Uid:u0,Namespace:mwk-apiaway,Attempt:0,}"
time="2026-11-29T01:00:00.200000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:other,Uid:u9,Namespace:default,Attempt:0,}"
time="2026-11-29T01:00:31.100000000Z" level=error msg="RunPodSandbox for &PodSandboxMetadata{Name:away-0,Uid:u0,Namespace:mwk-apiaway,Attempt:0,} failed, error" error="failed to setup network for sandbox \"abc\": plugin type=\"istio-cni\" failed (add): connection refused"
time="2026-11-29T01:00:40.000000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:away-0,Uid:u0,Namespace:mwk-apiaway,Attempt:0,}"
time="2026-11-29T01:00:40.500000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:away-0,Uid:u0,Namespace:mwk-apiaway,Attempt:0,} returns sandbox id \"def\""
time="2026-11-29T01:00:41.000000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:away-1,Uid:u1,Namespace:mwk-apiaway,Attempt:0,}"
`

func TestParseSandboxCalls(t *testing.T) {
	calls, err := parseSandboxCalls(strings.NewReader(containerdLog), "mwk-apiaway")
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 3 {
		t.Fatalf("%d calls, want 3: %+v", len(calls), calls)
	}
	if c := calls[0]; c.Pod != "away-0" || c.End.Sub(c.Start) != 31*time.Second || !strings.Contains(c.Err, `plugin type=\"istio-cni\" failed`) {
		t.Errorf("the failed call: %+v", c)
	}
	if c := calls[1]; c.Err != "" || c.End.Sub(c.Start) != 500*time.Millisecond {
		t.Errorf("the retry: %+v", c)
	}
	if c := calls[2]; c.Pod != "away-1" || !c.End.IsZero() {
		t.Errorf("the running call: %+v", c)
	}
}
