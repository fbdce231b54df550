package flags

import (
	"os"
	"strings"
	"testing"
)

const iptablesInitDoc = "../../../docs/iptables-init.md"

// TestFlagTableUpToDate fails when docs/iptables-init.md's flag table is not
// what the flag definitions produce: run `go generate ./internal/intercept/flags`.
func TestFlagTableUpToDate(t *testing.T) {
	doc, err := os.ReadFile(iptablesInitDoc)
	if err != nil {
		t.Fatal(err)
	}
	want, err := SpliceFlagTable(doc)
	if err != nil {
		t.Fatalf("%s: %v", iptablesInitDoc, err)
	}
	if string(want) != string(doc) {
		t.Errorf("%s: the flag table differs from the flag definitions; run `go generate ./internal/intercept/flags` and commit the result", iptablesInitDoc)
	}
}

// TestFlagDocsComplete: every flag has its documentation, and nothing else does.
func TestFlagDocsComplete(t *testing.T) {
	seen := map[string]bool{}
	for _, d := range flagDefs {
		seen[d.long] = true
		doc, ok := flagDocs[d.long]
		if !ok || strings.TrimSpace(doc.meaning) == "" {
			t.Errorf("flag --%s has no meaning in flagDocs", d.long)
		}
		if strings.Contains(doc.meaning, "|") || strings.Contains(doc.def, "|") {
			t.Errorf("flag --%s: a '|' would break the markdown table", d.long)
		}
	}
	for long := range flagDocs {
		if !seen[long] {
			t.Errorf("flagDocs documents --%s, which is no flag", long)
		}
	}
}
