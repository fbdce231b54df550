package netns

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// TestOpenRefuses: what is not a namespace is code 4 naming CNI_NETNS, and
// IsGone (DEL then has nothing to do inside).
func TestOpenRefuses(t *testing.T) {
	file := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"", file, filepath.Join(t.TempDir(), "missing")} {
		ns, err := Open(path)
		if err == nil {
			ns.Close()
			t.Fatalf("Open(%q) succeeded", path)
		}
		if cnierr.Code(err) != cnierr.CodeInvalidEnv {
			t.Errorf("Open(%q): code %d, want %d: %v", path, cnierr.Code(err), cnierr.CodeInvalidEnv, err)
		}
		if path != "" && !IsGone(err) {
			t.Errorf("Open(%q): not IsGone: %v", path, err)
		}
	}
}
