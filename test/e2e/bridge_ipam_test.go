//go:build kernel

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/meshwire/meshwire/internal/hostlocal/store"
	"github.com/meshwire/meshwire/internal/ipamexec"
	"github.com/meshwire/meshwire/test/harness"
)

// TestBridgeIPAMInProcess: bridge runs host-local in-process exactly when
// the host-local on CNI_PATH is the binary built with it, and executes any
// other (the reference's, or any binary when MESHWIRE_IPAM_EXEC=1); the
// addresses come from whichever ran.
func TestBridgeIPAMInProcess(t *testing.T) {
	refFirst := func(t *testing.T, e *bridgeEnv) {
		dir := t.TempDir()
		if err := os.Symlink(filepath.Join(harness.ReferenceDir, "host-local"), filepath.Join(dir, "host-local")); err != nil {
			t.Fatal(err)
		}
		e.h.CNIPath = []string{dir, e.h.BinDir}
		e.h.CNI = libcni.NewCNIConfigWithCacheDir(e.h.CNIPath, e.h.CacheDir, nil)
	}
	cases := []struct {
		name      string
		setup     func(t *testing.T, e *bridgeEnv)
		inProcess bool
		// store is the file that proves which host-local allocated.
		store func(dataDir, addr string) string
	}{
		{"meshwire", nil, true, func(d, _ string) string { return filepath.Join(d, "mwtb-ipam", store.DBName) }},
		{"reference", refFirst, false, func(d, addr string) string { return filepath.Join(d, "mwtb-ipam", addr) }},
		{"exec-only", func(t *testing.T, _ *bridgeEnv) { t.Setenv(ipamexec.EnvExecOnly, "1") }, false,
			func(d, _ string) string { return filepath.Join(d, "mwtb-ipam", store.DBName) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newBridgeEnv(t)
			if tc.setup != nil {
				tc.setup(t, e)
			}
			logFile := filepath.Join(t.TempDir(), "bridge.log")
			list := e.list("1.0.0", "mwtb-ipam", map[string]any{"log": map[string]string{"file": logFile, "level": "debug"}}, "198.18.27.0/24")
			a := e.h.Attach(list, e.h.NewNS("br"), "eth0", nil)
			r := a.MustAdd()
			if len(r.IPs) != 1 || r.IPs[0].Address.String() != "198.18.27.2/24" {
				t.Fatalf("result IPs %v", r.IPs)
			}
			if _, err := os.Stat(tc.store(e.dataDir, "198.18.27.2")); err != nil {
				t.Fatalf("the expected host-local did not allocate: %v", err)
			}
			if err := a.Check(); err != nil {
				t.Fatalf("CHECK: %v", err)
			}
			if err := a.Del(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			b, err := os.ReadFile(logFile)
			if err != nil {
				t.Fatal(err)
			}
			n := strings.Count(string(b), `"msg":"ipam in-process"`)
			if tc.inProcess && n != 3 || !tc.inProcess && n != 0 {
				t.Fatalf("%d in-process IPAM calls for ADD, CHECK and DEL (want in-process: %v); log:\n%s", n, tc.inProcess, b)
			}
			if tc.name == "reference" {
				if _, err := os.Stat(tc.store(e.dataDir, "198.18.27.2")); !os.IsNotExist(err) {
					t.Fatalf("DEL left the reference's allocation: %v", err)
				}
			}
		})
	}
}
