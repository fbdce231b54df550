package interceptenv

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/meshwire/meshwire/ebpf/capture"
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
	return st, status(h, &st)
}

// CaptureStatus is the ebpf interception part of `meshwire fastpath status
// --json`, decoded.
func CaptureStatus(h *harness.H) (capture.Status, error) {
	var st struct {
		Capture capture.Status `json:"ebpf_interception"`
	}
	err := status(h, &st)
	return st.Capture, err
}

func status(h *harness.H, v any) error {
	code, out, err := Fastpath(h, "status", "--json")
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, strings.TrimSpace(out))
	}
	if err == nil {
		err = json.Unmarshal([]byte(out), v)
	}
	if err != nil {
		return fmt.Errorf("meshwire fastpath status --json: %w", err)
	}
	return nil
}
