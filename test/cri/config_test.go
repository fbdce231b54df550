package cri

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestClusterConfig: the cluster's and critest's containerd config
// (test/cluster/lib/common.sh's write_containerd_config) and the CRI tests'
// are one template filled alike: what the script writes is what
// RenderConfig gives for the script's values, with every placeholder
// filled.
func TestClusterConfig(t *testing.T) {
	state := t.TempDir()
	script := `. test/cluster/lib/common.sh && SOCK=$STATE/containerd/containerd.sock CNI_BIN=$STATE/cni/bin CNI_CONF=$STATE/cni/net.d && ` +
		`write_containerd_config "$STATE/config/containerd.toml" "$STATE/containerd" "$STATE/containerd/state" "$SOCK" "$STATE/containerd/runc" "$CNI_BIN" "$CNI_CONF" && ` +
		`printf '%s\n' "$SOCK" "$SANDBOX_IMAGE" "$RUNC" "$CNI_BIN" "$CNI_CONF"`
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "MESHWIRE_CLUSTER_STATE="+state)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("write_containerd_config: %v\n%s", err, out)
	}
	v := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(v) != 5 {
		t.Fatalf("the script's values: %q", out)
	}
	got, err := os.ReadFile(filepath.Join(state, "config", "containerd.toml"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := RenderConfig(Settings{Root: state + "/containerd/root", State: state + "/containerd/state",
		Socket: v[0], Opt: state + "/containerd/opt", SandboxImage: v[1], Runc: v[2],
		RuncRoot: state + "/containerd/runc", CNIBin: v[3], CNIConf: v[4]})
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("the script wrote\n%s\nRenderConfig gives\n%s", got, want)
	}
	for _, line := range strings.Split(want, "\n") {
		if !strings.HasPrefix(line, "#") && strings.Contains(line, "@") {
			t.Errorf("a placeholder left: %s", line)
		}
	}
	if !strings.Contains(want, `bin_dir = "`+v[3]+`"`) {
		t.Errorf("bin_dir not filled:\n%s", want)
	}
	if _, err := RenderConfig(Settings{Root: `a"b`}); err == nil {
		t.Error("a value with a quote was rendered")
	}
}
