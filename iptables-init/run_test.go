package main

import (
	"bytes"
	"strings"
	"testing"
)

func noEnv(string) string { return "" }

// TestRunBadFlagsExit2 checks the exit status and that a bad command line
// stops before anything is touched (Run returns before entering a
// namespace or reading the firewall).
func TestRunBadFlagsExit2(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Run([]string{"-p", "nope", "--network-namespace", "/nonexistent"}, noEnv, &out, &errb); code != ExitUsage {
		t.Fatalf("exit %d, want %d", code, ExitUsage)
	}
	if out.Len() != 0 || !strings.Contains(errb.String(), "--envoy-port") || !strings.Contains(errb.String(), "Nothing was changed") {
		t.Fatalf("stdout %q stderr %q", out.String(), errb.String())
	}
	out.Reset()
	if code := Run([]string{"-h"}, noEnv, &out, &errb); code != ExitOK || !strings.Contains(out.String(), "--istio-inbound-interception-mode") {
		t.Fatalf("help: exit %d, %q", code, out.String())
	}
}
