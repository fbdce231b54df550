package podrecord

import (
	"maps"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/internal/recordfile"
)

// TestRecords: records are written whole, read back, found stale by their
// namespace's inode and removed only with the inode reported; a replay
// with no fast path at its pin directory writes nothing but still drops
// the records of gone namespaces and unreadable files.
func TestRecords(t *testing.T) {
	dir := t.TempDir()
	a, b := Name("c1", "eth0"), Name("c/2", "eth0")
	if b != "c_2-eth0" {
		t.Fatalf("Name does not keep a record in the directory: %q", b)
	}
	for name, r := range map[string]Record{a: {Netns: 1, NetnsIno: 10, Policy: podpolicy.Policy{IntoProxy: true}}, b: {Netns: 2, NetnsIno: 20}} {
		if err := Write(dir, name, r); err != nil {
			t.Fatal(err)
		}
	}
	live := func() (map[uint64]bool, error) { return map[uint64]bool{10: true}, nil }
	stale, err := Stale(dir, live)
	if err != nil || !maps.Equal(stale, map[uint64]uint64{2: 20}) {
		t.Fatalf("stale %v (%v), want 2 -> 20", stale, err)
	}
	if err := ForgetStale(dir, 2, 21); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
		t.Fatalf("a record with another inode was removed: %v", err)
	}
	if err := ForgetStale(dir, 2, 20); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, b)); !os.IsNotExist(err) {
		t.Fatalf("the stale record is still there: %v", err)
	}
	recs, _, err := read(dir)
	if err != nil || len(recs) != 1 || !recs[a].Policy.IntoProxy {
		t.Fatalf("records %+v (%v), want %s with its policy", recs, err, a)
	}

	if err := Write(dir, b, Record{Netns: 2, NetnsIno: 20}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".tmp-123"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	done, err := Replay(dir, filepath.Join(t.TempDir(), "no-fast-path"), live)
	if err != nil || done.Pods != 0 || done.Dropped != 1 {
		t.Fatalf("replay without a fast path: %+v (%v), want 0 written, 1 dropped", done, err)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 1 || left[0].Name() != a {
		t.Fatalf("left %v, want only %s", left, a)
	}
	// A write of a cut short (killed before its rename) left its
	// temporary file: the DEL's Remove takes it with the record.
	if err := os.WriteFile(filepath.Join(dir, recordfile.TmpPrefix(a)+"42"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Remove(dir, a); err != nil || Remove(dir, a) != nil {
		t.Fatalf("remove twice: %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("left %v after the DEL's Remove", left)
	}
}

// TestReplayReadsTwice: a record whose namespace one read of the live
// namespaces misses (a sandbox passing it between holders) stays when the
// second read has it; one that neither read has goes.
func TestReplayReadsTwice(t *testing.T) {
	dir := t.TempDir()
	a, b := Name("c1", "eth0"), Name("c2", "eth0")
	for name, r := range map[string]Record{a: {Netns: 1, NetnsIno: 10}, b: {Netns: 2, NetnsIno: 20}} {
		if err := Write(dir, name, r); err != nil {
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
	done, err := Replay(dir, filepath.Join(t.TempDir(), "no-fast-path"), live)
	if err != nil || done.Dropped != 1 || reads != 2 {
		t.Fatalf("replay: %+v (%v) after %d reads, want 1 dropped after 2 reads", done, err, reads)
	}
	if left, _ := os.ReadDir(dir); len(left) != 1 || left[0].Name() != a {
		t.Fatalf("left %v, want only %s (its namespace was in the second read)", left, a)
	}
}
