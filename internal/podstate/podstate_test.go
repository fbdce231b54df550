package podstate

import (
	"encoding/json"
	"errors"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/recordfile"
)

func testStore(t *testing.T) Store { return New(nodelayout.At(t.TempDir())) }

// TestRecordKeptUntilDEL: a record written is read back whole, in a
// directory root's alone; a write cut short (a temporary file) is not a
// record, and the DEL's Remove takes it with the record; a second Remove
// is not an error.
func TestRecordKeptUntilDEL(t *testing.T) {
	s := testStore(t)
	r := Record{ContainerID: "c/1", IfName: "eth0", Netns: "/var/run/netns/cni-1", UID: "u1", Namespace: "shop", Name: "web",
		IPs:         []netip.Addr{netip.MustParseAddr("10.0.0.5")},
		Annotations: IstioAnnotations(map[string]string{"istio.io/dataplane-mode": "ambient", "kubectl.kubernetes.io/last-applied-configuration": "{...}"}),
		Call:        &Call{Args: "K8S_POD_NAME=web", Config: []byte(`{"type":"intercept"}`)}}
	if r.File() != "c_1-eth0" {
		t.Fatalf("a record's name leaves the directory: %q", r.File())
	}
	if err := s.Put(r); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{s.Dir(): 0o700, filepath.Join(s.Dir(), r.File()): 0o600} {
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != want {
			t.Fatalf("%s: mode %v (%v), want %v", path, st.Mode().Perm(), err, want)
		}
	}
	cut := filepath.Join(s.Dir(), recordfile.TmpPrefix(r.File())+"7")
	if err := os.WriteFile(cut, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.Read(r.File())
	if err != nil || !ok || got.Key() != "shop/web" || len(got.Annotations) != 1 || got.IPs[0] != r.IPs[0] || string(got.Call.Config) != string(r.Call.Config) {
		t.Fatalf("Read: %+v %v %v", got, ok, err)
	}
	if all, err := s.List(); err != nil || len(all) != 1 {
		t.Fatalf("List: %v %v", all, err)
	}
	if err := s.Remove(r.File()); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(s.Dir()); len(entries) != 0 {
		t.Fatalf("left after Remove: %v", entries)
	}
	if err := s.Remove(r.File()); err != nil {
		t.Fatalf("a second Remove: %v", err)
	}
}

// TestNames: a record's name is one path element, and not a temporary
// file's: what the agent's socket accepts from a client.
func TestNames(t *testing.T) {
	s := testStore(t)
	for _, bad := range []string{"", ".", "..", "../x", "a/b", "/etc/passwd", ".tmp-a", "a\x00b", "a\nb"} {
		if _, _, err := s.Read(bad); err == nil {
			t.Errorf("Read(%q) accepted", bad)
		}
		if _, err := s.Update(bad, true, func(*Record) error { return nil }); err == nil {
			t.Errorf("Update(%q) accepted", bad)
		}
	}
	if _, ok, err := s.Read("c1-eth0"); ok || err != nil {
		t.Fatalf("Read of no record: %v %v", ok, err)
	}
}

// TestUpdate: Update changes one section and keeps the others; without
// create it does not bring back a record a DEL removed; a record left
// empty goes.
func TestUpdate(t *testing.T) {
	s := testStore(t)
	name := Name("c1", "eth0")
	if _, err := s.Update(name, false, func(r *Record) error { return nil }); !errors.Is(err, ErrGone) {
		t.Fatalf("Update of no record without create: %v", err)
	}
	if _, err := s.Update(name, true, func(r *Record) error {
		r.ContainerID, r.IfName, r.NetnsIno = "c1", "eth0", 10
		r.Fastpath = &Fastpath{Cookie: 1, Policy: podpolicy.Policy{IntoProxy: true}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r, err := s.Update(name, false, func(r *Record) error { r.Call = &Call{Config: []byte(`{}`)}; return nil })
	if err != nil || r.Fastpath == nil || !r.Fastpath.Policy.IntoProxy || r.Call == nil {
		t.Fatalf("second section: %+v, %v", r, err)
	}
	// A repeated ADD of the pod (Put) keeps the agent's enrollment of
	// the same namespace, not that of another.
	if _, err := s.Update(name, false, func(r *Record) error { r.Ambient = &Enrollment{Why: "labeled"}; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(Record{ContainerID: "c1", IfName: "eth0", NetnsIno: 10, Call: &Call{}}); err != nil {
		t.Fatal(err)
	}
	if r, _, _ := s.Read(name); r.Ambient == nil || r.Fastpath != nil {
		t.Fatalf("after a repeated ADD: %+v", r)
	}
	if err := s.Put(Record{ContainerID: "c1", IfName: "eth0", NetnsIno: 11, Call: &Call{}}); err != nil {
		t.Fatal(err)
	}
	if r, _, _ := s.Read(name); r.Ambient != nil {
		t.Fatalf("the enrollment of another namespace stayed: %+v", r)
	}
	if _, err := s.Update(name, false, func(r *Record) error { r.Call, r.Fastpath = nil, nil; return nil }); err != nil {
		t.Fatal(err)
	}
	if s.Exists(name) {
		t.Fatal("a record with nothing left is still there")
	}
}

// TestStale: records are found stale by their namespace's inode and
// removed only with the inode reported; a replay with no fast path at
// its pin directory writes nothing but still drops the records of gone
// namespaces.
func TestStale(t *testing.T) {
	s := testStore(t)
	a, b := Name("c1", "eth0"), Name("c2", "eth0")
	for _, r := range []Record{
		{ContainerID: "c1", IfName: "eth0", NetnsIno: 10, Fastpath: &Fastpath{Cookie: 1, Policy: podpolicy.Policy{IntoProxy: true}}},
		{ContainerID: "c2", IfName: "eth0", NetnsIno: 20, Fastpath: &Fastpath{Cookie: 2}},
	} {
		if err := s.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	live := func() (map[uint64]bool, error) { return map[uint64]bool{10: true}, nil }
	stale, err := s.Stale(live)
	if err != nil || !maps.Equal(stale, map[string]uint64{b: 20}) {
		t.Fatalf("stale %v (%v), want %s -> 20", stale, err, b)
	}
	if err := s.Forget(b, 21); err != nil || !s.Exists(b) {
		t.Fatalf("a record with another inode was removed: %v", err)
	}
	if err := s.Forget(b, 20); err != nil || s.Exists(b) {
		t.Fatalf("the stale record is still there: %v", err)
	}
	if err := s.Put(Record{ContainerID: "c2", IfName: "eth0", NetnsIno: 20, Fastpath: &Fastpath{Cookie: 2}}); err != nil {
		t.Fatal(err)
	}
	done, err := s.Replay(filepath.Join(t.TempDir(), "no-fast-path"), live)
	if err != nil || done.Pods != 0 || done.Dropped != 1 {
		t.Fatalf("replay without a fast path: %+v (%v), want 0 written, 1 dropped", done, err)
	}
	if !s.Exists(a) || s.Exists(b) {
		t.Fatalf("left: %s %v, %s %v; want only %s", a, s.Exists(a), b, s.Exists(b), a)
	}
}

// TestReplayReadsTwice: a record whose namespace one read of the live
// namespaces misses (a sandbox passing it between holders) stays when the
// second read has it; one that neither read has goes.
func TestReplayReadsTwice(t *testing.T) {
	s := testStore(t)
	for _, r := range []Record{{ContainerID: "c1", IfName: "eth0", NetnsIno: 10, Fastpath: &Fastpath{Cookie: 1}}, {ContainerID: "c2", IfName: "eth0", NetnsIno: 20, Fastpath: &Fastpath{Cookie: 2}}} {
		if err := s.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	reads := 0
	live := func() (map[uint64]bool, error) {
		reads++
		if reads == 1 {
			return map[uint64]bool{}, nil // 10 not seen yet
		}
		return map[uint64]bool{10: true}, nil
	}
	done, err := s.Replay(filepath.Join(t.TempDir(), "no-fast-path"), live)
	if err != nil || done.Dropped != 1 || reads != 2 {
		t.Fatalf("replay: %+v (%v) after %d reads, want 1 dropped after 2 reads", done, err, reads)
	}
	if !s.Exists(Name("c1", "eth0")) || s.Exists(Name("c2", "eth0")) {
		t.Fatal("want only c1's record left (its namespace was in the second read)")
	}
}

// writeJSON writes v as file name under dir, as an earlier version did.
func writeJSON(t *testing.T, dir, name string, v any) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestMigrate: the four stores of earlier versions, as they wrote their
// files, become one record per pod: a sidecar pod's call and fast-path
// record, an init-container pod's fast-path record alone, an ambient
// pod's namespace record (already in the pods' directory) and its
// enrollment; an enrollment whose pod's record is gone (its DEL ran while
// no agent ran) is dropped. The old files and their directories go, and a
// second run finds nothing.
func TestMigrate(t *testing.T) {
	s := testStore(t)
	l := s.Layout
	side, initc, amb, gone := Name("side", "eth0"), Name("init", "eth0"), Name("amb", "eth0"), Name("gone", "eth0")
	writeJSON(t, l.LegacyCalls(), side, map[string]any{"containerID": "side", "netns": "/var/run/netns/a", "ifName": "eth0",
		"args": "K8S_POD_NAME=side", "config": []byte(`{"name":"k8s-pod-network","type":"intercept"}`), "netnsIno": 11, "netnsDev": 4})
	writeJSON(t, l.LegacyFastpath(), side, map[string]any{"netns_cookie": 7, "netns_ino": 11, "policy": map[string]bool{"IntoProxy": true},
		"mirror": map[string]any{"Capture": map[string]any{"Flags": 3}}})
	writeJSON(t, l.LegacyFastpath(), initc, map[string]any{"netns_cookie": 8, "netns_ino": 12, "policy": map[string]bool{"NoPeer": true}})
	writeJSON(t, l.LegacyFastpath(), recordfile.TmpPrefix(initc)+"1", map[string]any{}) // a write cut short
	writeJSON(t, l.Pods(), amb, map[string]any{"containerID": "amb", "ifName": "eth0", "netns": "/var/run/netns/b", "netnsIno": 13, "netnsDev": 4,
		"uid": "u-amb", "namespace": "shop", "name": "web", "ips": []string{"10.0.0.9"}, "annotations": map[string]string{"istio.io/dataplane-mode": "ambient"}})
	pod := map[string]any{"containerID": "amb", "ifName": "eth0", "netns": "/var/run/netns/b", "netnsIno": 13, "netnsDev": 4, "namespace": "shop", "name": "web"}
	writeJSON(t, l.LegacyEnrolled(), amb, map[string]any{"pod": pod, "backend": "iptables-nft", "ips": []string{"10.0.0.9"},
		"enrollment": map[string]any{"Enrolled": true, "Why": "namespace labeled", "Pod": map[string]any{"DNS": 2}, "UID": "u-amb", "ServiceAccount": "web"}})
	writeJSON(t, l.LegacyEnrolled(), gone, map[string]any{"pod": map[string]any{"containerID": "gone", "netnsIno": 14}, "backend": "iptables-nft"})

	m, err := s.Migrate()
	if err != nil || m != (Migrated{Calls: 1, Fastpath: 2, Enrolled: 1, Dropped: 1}) {
		t.Fatalf("Migrate: %+v, %v", m, err)
	}
	recs, err := s.List()
	if err != nil || len(recs) != 3 {
		t.Fatalf("records %v, %v; want 3", recs, err)
	}
	r := recs[side]
	if r.Call == nil || r.Call.Args != "K8S_POD_NAME=side" || r.Network != "k8s-pod-network" || r.NetnsIno != 11 || r.NetnsDev != 4 ||
		r.Fastpath == nil || r.Fastpath.Cookie != 7 || !r.Fastpath.Policy.IntoProxy || r.Fastpath.Mirror == nil || r.Fastpath.Mirror.Capture.Flags != 3 {
		t.Fatalf("the sidecar pod's record: %+v", r)
	}
	if r := recs[initc]; r.Call != nil || r.Fastpath == nil || r.Fastpath.Cookie != 8 || !r.Fastpath.Policy.NoPeer || r.NetnsIno != 12 {
		t.Fatalf("the init-container pod's record: %+v", r)
	}
	r = recs[amb]
	if r.Ambient == nil || r.Ambient.UID != "u-amb" || r.Ambient.ServiceAccount != "web" || r.Ambient.Backend != "iptables-nft" ||
		r.Ambient.Overrides.DNS != ambient.DNSOff || len(r.Ambient.IPs) != 1 || r.Key() != "shop/web" || r.Annotations["istio.io/dataplane-mode"] != "ambient" {
		t.Fatalf("the ambient pod's record: %+v (%+v)", r, r.Ambient)
	}
	for _, d := range l.Legacy() {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", d, err)
		}
	}
	if m, err := s.Migrate(); err != nil || m.Any() {
		t.Fatalf("a second Migrate: %+v, %v", m, err)
	}
	// An earlier plugin's DEL on a node not migrated yet: its files go
	// with the DEL's RemoveLegacy.
	writeJSON(t, l.LegacyCalls(), side, map[string]any{"containerID": "side"})
	if err := s.RemoveLegacy(side); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(l.LegacyCalls(), side)); !os.IsNotExist(err) {
		t.Fatalf("RemoveLegacy left the call: %v", err)
	}
}
