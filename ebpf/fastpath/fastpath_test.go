package fastpath

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/internal/structlayout"
)

// TestObjectMatchesLoader: the committed object has the programs, maps and
// constants the loader uses (a stale `make generate` fails here).
func TestObjectMatchesLoader(t *testing.T) {
	spec, err := loadBpf()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"proxy_uid", "proxy_gid", "match_gid", "outbound_port", "into_proxy"} {
		if spec.Variables[v] == nil {
			t.Errorf("constant %s missing from the object", v)
		}
	}
	if m := spec.Maps["mw_counters"]; m == nil || m.MaxEntries != cMax {
		t.Errorf("mw_counters has %v entries, the loader reads %d", m, cMax)
	}
	for _, p := range []string{"mw_sockops", "mw_msg"} {
		if spec.Programs[p] == nil {
			t.Errorf("program %s missing", p)
		}
	}
	if m := spec.Maps["mw_pods"]; m == nil || m.KeySize != 8 || m.ValueSize != uint32(unsafe.Sizeof(podpolicy.Value{})) {
		t.Errorf("mw_pods is %+v: podpolicy writes 8-byte keys and %d-byte values", m, unsafe.Sizeof(podpolicy.Value{}))
	}
}

// TestPodPolicyLayout: podpolicy's value, which the intercept plugin writes
// without loading the object, is fastpath.c's struct pod_policy field for
// field (TestFastpathPodPolicy checks the flag by its effect).
func TestPodPolicyLayout(t *testing.T) {
	got, want := structlayout.Describe(podpolicy.Value{}, true), structlayout.Describe(bpfPodPolicy{}, true)
	if !slices.Equal(got, want) {
		t.Fatalf("podpolicy.Value is %v, struct pod_policy %v", got, want)
	}
}

// TestRulesLayout: the mirrored interception settings, which package pods
// writes as it writes ebpf interception's, have fastpath.c's layouts
// (capture_rules.h, shared with capture.c; capture's TestLayoutsMatch
// checks the other object).
func TestRulesLayout(t *testing.T) {
	for _, c := range []struct {
		name      string
		ours, gen any
	}{
		{"struct pod_capture", pods.Capture{}, bpfPodCapture{}},
		{"struct port_key", pods.PortKey{}, bpfPortKey{}},
		{"struct cidr_key", pods.CIDRKey{}, bpfCidrKey{}},
	} {
		if got, want := structlayout.Describe(c.ours, false), structlayout.Describe(c.gen, false); !slices.Equal(got, want) {
			t.Errorf("%s: package pods has %v, the object %v", c.name, got, want)
		}
	}
}

// TestProcFSGID: the file-system gid is the fourth value of a process's
// Gid line.
func TestProcFSGID(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		status string
		gid    uint32
		ok     bool
	}{
		{"Name:\tproxy\nUid:\t4242\t4242\t4242\t4242\nGid:\t1337\t1337\t1337\t1338\nGroups:\t\n", 1338, true},
		{"Name:\tproxy\nGid:\t1 2 3\n", 0, false},
		{"Name:\tproxy\n", 0, false},
		{"Gid:\t1\t2\t3\tx\n", 0, false},
	} {
		if err := os.WriteFile(filepath.Join(dir, "status"), []byte(tc.status), 0o644); err != nil {
			t.Fatal(err)
		}
		if gid, ok := procFSGID(dir); gid != tc.gid || ok != tc.ok {
			t.Errorf("procFSGID(%q) = %d, %v; want %d, %v", tc.status, gid, ok, tc.gid, tc.ok)
		}
	}
	if _, ok := procFSGID(filepath.Join(dir, "gone")); ok {
		t.Error("a process that is gone has a gid")
	}
}
