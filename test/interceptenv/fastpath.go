package interceptenv

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/test/harness"
)

// Fastpath runs the built `meshwire fastpath ARGS` and returns its exit code
// and combined output; err is set only when it could not run at all.
func Fastpath(h *harness.H, args ...string) (int, string, error) {
	cmd := exec.Command(filepath.Join(h.BinDir, "meshwire"), append([]string{"fastpath"}, args...)...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out), nil
	}
	return 0, string(out), err
}

// FastpathStatus is `meshwire fastpath status --json`, decoded.
func FastpathStatus(h *harness.H) (fastpath.Status, error) {
	var st fastpath.Status
	code, out, err := Fastpath(h, "status", "--json")
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, strings.TrimSpace(out))
	}
	if err == nil {
		err = json.Unmarshal([]byte(out), &st)
	}
	if err != nil {
		return st, fmt.Errorf("meshwire fastpath status --json: %w", err)
	}
	return st, nil
}
