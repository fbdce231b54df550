package store

import (
	"errors"
	"fmt"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/filelock"
)

const testNet = "mwt-hl-store"

// envCrashHelper makes the test binary run crashLoop instead of the tests:
// the crash test starts it, kills it with SIGKILL and checks the store.
const envCrashHelper = "MWT_HL_STORE_CRASH_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(envCrashHelper); dir != "" {
		crashLoop(dir)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func openTest(t *testing.T, dataDir string) *Store {
	t.Helper()
	s, err := Open(dataDir, testNet, 5*time.Second)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func ip(s string) net.IP {
	a := net.ParseIP(s)
	if v4 := a.To4(); v4 != nil {
		return v4
	}
	return a
}

func TestStoreReserveLookupRelease(t *testing.T) {
	s := openTest(t, t.TempDir())
	o1 := Owner{ID: "c1", IfName: "eth0"}
	o2 := Owner{ID: "c1", IfName: "eth1"} // same container, other interface
	err := s.Update(func(tx *Tx) error {
		for _, a := range []Allocation{
			{IP: ip("198.18.0.2"), Owner: o1},
			{IP: ip("fd10::2"), Owner: o1, RangeSet: 1},
			{IP: ip("198.18.0.3"), Owner: o2},
		} {
			if err := tx.Reserve(a); err != nil {
				return err
			}
		}
		if err := tx.Reserve(Allocation{IP: ip("198.18.0.2"), Owner: o2}); !errors.Is(err, ErrTaken) {
			return fmt.Errorf("reserving a held address: got %v, want ErrTaken", err)
		}
		return tx.SetLastReserved(0, ip("198.18.0.3"))
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.View(func(tx *Tx) error {
		got, err := tx.ByOwner(o1)
		if err != nil {
			return err
		}
		if len(got) != 2 || !got[0].IP.Equal(ip("198.18.0.2")) || !got[1].IP.Equal(ip("fd10::2")) || got[1].RangeSet != 1 {
			return fmt.Errorf("ByOwner(o1) = %+v", got)
		}
		if a, ok, _ := tx.Get(ip("198.18.0.3")); !ok || a.Owner != o2 {
			return fmt.Errorf("Get(198.18.0.3) = %+v %v", a, ok)
		}
		if !tx.Taken(ip("198.18.0.2")) || tx.Taken(ip("198.18.0.4")) || !tx.Taken(ip("198.18.0.3")) || tx.Taken(ip("198.18.0.1")) {
			return errors.New("Taken disagrees with the allocations")
		}
		if last := tx.LastReserved(0); !last.Equal(ip("198.18.0.3")) || len(last) != 4 {
			return fmt.Errorf("LastReserved(0) = %v", last)
		}
		if tx.LastReserved(3) != nil {
			return errors.New("LastReserved of an unused range set is not nil")
		}
		return tx.Verify()
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Update(func(tx *Tx) error {
		rel, err := tx.ReleaseOwner(o1)
		if err != nil || len(rel) != 2 {
			return fmt.Errorf("ReleaseOwner = %v, %v", rel, err)
		}
		rel, err = tx.ReleaseOwner(o1) // idempotent
		if err != nil || len(rel) != 0 {
			return fmt.Errorf("second ReleaseOwner = %v, %v", rel, err)
		}
		if count(tx) != 1 {
			return fmt.Errorf("count %d after release, want 1", count(tx))
		}
		return tx.Verify()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestStoreTakenWalk: the cursor-reusing Taken answers right for any order
// of questions, as a map would.
func TestStoreTakenWalk(t *testing.T) {
	s := openTest(t, t.TempDir())
	rnd := rand.New(rand.NewSource(1))
	held := map[string]bool{}
	err := s.Update(func(tx *Tx) error {
		for i := 0; i < 300; i++ {
			a := net.IPv4(198, 18, byte(rnd.Intn(4)), byte(rnd.Intn(256))).To4()
			if held[a.String()] {
				continue
			}
			held[a.String()] = true
			if err := tx.Reserve(Allocation{IP: a, Owner: Owner{ID: "c" + strconv.Itoa(i), IfName: "eth0"}}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.View(func(tx *Tx) error {
		for i := 0; i < 4*256; i++ { // ascending
			a := net.IPv4(198, 18, byte(i/256), byte(i)).To4()
			if tx.Taken(a) != held[a.String()] {
				t.Fatalf("ascending: Taken(%s) = %v", a, !held[a.String()])
			}
		}
		for i := 0; i < 2000; i++ { // random
			a := net.IPv4(198, 18, byte(rnd.Intn(5)), byte(rnd.Intn(256))).To4()
			if tx.Taken(a) != held[a.String()] {
				t.Fatalf("random: Taken(%s) = %v", a, !held[a.String()])
			}
		}
		return nil
	})
}

// TestStoreFailedUpdateLeavesNothing: a transaction whose function fails
// commits nothing.
func TestStoreFailedUpdateLeavesNothing(t *testing.T) {
	s := openTest(t, t.TempDir())
	boom := errors.New("boom")
	err := s.Update(func(tx *Tx) error {
		if err := tx.Reserve(Allocation{IP: ip("198.18.0.2"), Owner: Owner{ID: "c", IfName: "eth0"}}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) && !strings.Contains(fmt.Sprint(err), "boom") {
		t.Fatalf("Update error %v, want boom", err)
	}
	_ = s.View(func(tx *Tx) error {
		if count(tx) != 0 {
			t.Fatalf("a failed update left %d allocations", count(tx))
		}
		return nil
	})
}

// TestStoreLockTimeout: a held lock makes Open fail with code 11 within the
// bound.
func TestStoreLockTimeout(t *testing.T) {
	dataDir := t.TempDir()
	l, err := filelock.Acquire(filepath.Join(dataDir, testNet, LockName), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	start := time.Now()
	_, err = Open(dataDir, testNet, 200*time.Millisecond)
	if cnierr.Code(err) != cnierr.CodeTryAgainLater {
		t.Fatalf("Open with the lock held: %v, want code 11", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Open waited %s with a 200ms bound", d)
	}
}

// writeReference writes a file the way the reference plugin does.
func writeReference(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestStoreReferenceLayout: a directory written by the reference plugin is
// imported (addresses taken, owners known, round-robin position kept), and
// releasing an owner removes its files.
func TestStoreReferenceLayout(t *testing.T) {
	dataDir := t.TempDir()
	dir := Dir(dataDir, testNet)
	writeReference(t, dir, "198.18.0.5", "ref1\r\neth0")
	writeReference(t, dir, "198.18.0.6", "ref2\r\neth0\n")
	writeReference(t, dir, "fd10::5", "ref1\r\neth0")
	writeReference(t, dir, "198.18.0.7", "  old-style-id  ") // id only, written by old versions
	writeReference(t, dir, "last_reserved_ip.0", "198.18.0.6")
	writeReference(t, dir, "not-an-address", "x\r\ny")

	s := openTest(t, dataDir)
	err := s.View(func(tx *Tx) error {
		for addr, want := range map[string]Owner{
			"198.18.0.5": {ID: "ref1", IfName: "eth0"},
			"198.18.0.6": {ID: "ref2", IfName: "eth0"},
			"fd10::5":    {ID: "ref1", IfName: "eth0"},
			"198.18.0.7": {ID: "old-style-id"},
		} {
			a, ok, err := tx.Get(ip(addr))
			if err != nil || !ok || a.Owner != want || !a.Legacy {
				return fmt.Errorf("%s: got %+v %v %v, want legacy owner %v", addr, a, ok, err, want)
			}
		}
		if count(tx) != 4 {
			return fmt.Errorf("%d allocations imported, want 4", count(tx))
		}
		if !tx.LastReserved(0).Equal(ip("198.18.0.6")) {
			return fmt.Errorf("round-robin position %v, want 198.18.0.6", tx.LastReserved(0))
		}
		// The id-only file belongs to every interface of that container.
		got, _ := tx.ByOwner(Owner{ID: "old-style-id", IfName: "eth3"})
		if len(got) != 1 {
			return fmt.Errorf("ByOwner(old-style-id, eth3) = %v", got)
		}
		return tx.Verify()
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Update(func(tx *Tx) error {
		rel, err := tx.ReleaseOwner(Owner{ID: "ref1", IfName: "eth0"})
		if len(rel) != 2 {
			return fmt.Errorf("released %v, want two addresses", rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"198.18.0.5", "fd10::5"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("reference file %s still there after release (%v)", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "198.18.0.6")); err != nil {
		t.Fatalf("another owner's file was removed: %v", err)
	}
	s.Close()

	// The reference plugin (on a node in the middle of an upgrade) adds
	// and removes files: the next Open sees both.
	writeReference(t, dir, "198.18.0.9", "ref3\r\neth0")
	if err := os.Remove(filepath.Join(dir, "198.18.0.6")); err != nil {
		t.Fatal(err)
	}
	s2 := openTest(t, dataDir)
	err = s2.View(func(tx *Tx) error {
		if !tx.Taken(ip("198.18.0.9")) || tx.Taken(ip("198.18.0.6")) {
			return errors.New("changes of the reference files were not picked up")
		}
		if count(tx) != 2 {
			return fmt.Errorf("count %d, want 2", count(tx))
		}
		return tx.Verify()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestStoreReadReferenceFile covers the content forms the reference wrote.
func TestStoreReadReferenceFile(t *testing.T) {
	for in, want := range map[string]Owner{
		"abc\r\neth0":     {ID: "abc", IfName: "eth0"},
		"abc\r\neth0\r\n": {ID: "abc", IfName: "eth0"},
		" abc ":           {ID: "abc"},
		"abc":             {ID: "abc"},
		"":                {},
	} {
		if got := ReadReferenceFile([]byte(in)); got != want {
			t.Errorf("ReadReferenceFile(%q) = %+v, want %+v", in, got, want)
		}
	}
}

// crashLoop runs in a child process: allocate and release forever, as
// back-to-back ADD and DEL commands would.
func crashLoop(dataDir string) {
	pid := os.Getpid()
	for i := 0; ; i++ {
		s, err := Open(dataDir, testNet, 10*time.Second)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		err = s.Update(func(tx *Tx) error {
			o := Owner{ID: fmt.Sprintf("p%d-%d", pid, i), IfName: "eth0"}
			for k := 0; k < 4096; k++ {
				a := net.IPv4(198, 18, byte(k/256), byte(k)).To4()
				if !tx.Taken(a) {
					if err := tx.Reserve(Allocation{IP: a, Owner: o}); err != nil {
						return err
					}
					return tx.SetLastReserved(0, a)
				}
			}
			return errors.New("full")
		})
		if err == nil && i%2 == 1 {
			err = s.Update(func(tx *Tx) error {
				_, err := tx.ReleaseOwner(Owner{ID: fmt.Sprintf("p%d-%d", pid, i-1), IfName: "eth0"})
				return err
			})
		}
		s.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
	}
}

// TestStoreSurvivesKill9 kills a process mid-operation (also while it
// creates the database) many times and checks each time that the store
// opens, its indexes agree and it takes new allocations.
func TestStoreSurvivesKill9(t *testing.T) {
	rnd := rand.New(rand.NewSource(time.Now().UnixNano()))
	dataDir := t.TempDir()
	for round := 0; round < 40; round++ {
		if round < 10 {
			dataDir = t.TempDir() // kill while the database is created
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envCrashHelper+"="+dataDir)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		delay := time.Duration(rnd.Intn(40000)) * time.Microsecond
		if round < 10 {
			delay = time.Duration(rnd.Intn(3000)) * time.Microsecond
		}
		time.Sleep(delay)
		_ = cmd.Process.Signal(syscall.SIGKILL)
		err := cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("round %d: helper ended by itself (%v): %s", round, err, stderr.String())
		}
		s, err := Open(dataDir, testNet, 5*time.Second)
		if err != nil {
			t.Fatalf("round %d (killed after %s): open after kill: %v", round, delay, err)
		}
		err = s.Update(func(tx *Tx) error {
			if err := tx.Verify(); err != nil {
				return err
			}
			o := Owner{ID: "after-crash-" + strconv.Itoa(round), IfName: "eth0"}
			a := net.IPv4(198, 18, 15, byte(round)).To4()
			if err := tx.Reserve(Allocation{IP: a, Owner: o}); err != nil {
				return err
			}
			_, err := tx.ReleaseOwner(o)
			return err
		})
		s.Close()
		if err != nil {
			t.Fatalf("round %d (killed after %s): %v", round, delay, err)
		}
		if _, err := os.Stat(filepath.Join(Dir(dataDir, testNet), DBName+".tmp")); err == nil && round >= 10 {
			t.Fatalf("round %d: a temporary database is left behind", round)
		}
	}
}

// TestStoreSettlesDirectoryTime: a command that records the directory's
// modification time returns only once the coarse file system clock has
// moved past it, so a reference file written right afterwards changes the
// time and is imported by the next command.
func TestStoreSettlesDirectoryTime(t *testing.T) {
	dataDir := t.TempDir()
	s, err := Open(dataDir, testNet, time.Second) // creates the database: the directory changes
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	fi, err := os.Stat(Dir(dataDir, testNet))
	if err != nil {
		t.Fatal(err)
	}
	if age := time.Since(fi.ModTime()); age < settle {
		t.Fatalf("Open returned %s after the directory changed, before the %s settle time", age, settle)
	}
	writeReference(t, Dir(dataDir, testNet), "198.18.0.9", "ref\r\neth0")
	s = openTest(t, dataDir)
	_ = s.View(func(tx *Tx) error {
		if !tx.Taken(ip("198.18.0.9")) {
			t.Fatal("a reference file written right after the import was missed")
		}
		return nil
	})
}

// TestStoreImportsManyReferenceFiles: a large reference directory (IPv4
// and IPv6, ids whose order differs from the addresses') is imported whole
// with both indexes in agreement.
func TestStoreImportsManyReferenceFiles(t *testing.T) {
	dataDir := t.TempDir()
	dir := Dir(dataDir, testNet)
	const n = 3000
	for i := 0; i < n; i++ {
		a := net.IPv4(198, 18, byte(i/256), byte(i)).String()
		if i%3 == 0 {
			a = fmt.Sprintf("fd10::%x", i)
		}
		writeReference(t, dir, a, fmt.Sprintf("id-%d\r\neth%d", n-i, i%2))
	}
	s := openTest(t, dataDir)
	_ = s.View(func(tx *Tx) error {
		if err := tx.Verify(); err != nil {
			t.Fatal(err)
		}
		if c := count(tx); c != n {
			t.Fatalf("imported %d allocations, want %d", c, n)
		}
		for _, i := range []int{0, 1, 1499, n - 1} {
			held, err := tx.ByOwner(Owner{ID: fmt.Sprintf("id-%d", n-i), IfName: fmt.Sprintf("eth%d", i%2)})
			if err != nil || len(held) != 1 {
				t.Fatalf("owner of file %d: %v %v", i, held, err)
			}
		}
		return nil
	})
}

// count is the number of allocations.
func count(t *Tx) int {
	n := 0
	c := t.ips.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		n++
	}
	return n
}

// An allocation's time is kept beside it: ForEach and ReadAll give it; a
// store of an earlier version (no "since" bucket) and an address an
// earlier version gave again (the entry names another owner) give none.
func TestStoreSince(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir)
	past := time.Now().Add(-time.Hour).Truncate(time.Nanosecond)
	before := time.Now()
	err := s.Update(func(tx *Tx) error {
		if err := tx.Reserve(Allocation{IP: ip("198.18.0.2"), Owner: Owner{ID: "old", IfName: "eth0"}, Since: past}); err != nil {
			return err
		}
		return tx.Reserve(Allocation{IP: ip("198.18.0.3"), Owner: Owner{ID: "new", IfName: "eth0"}})
	})
	if err != nil {
		t.Fatal(err)
	}
	since := func() map[string]time.Time {
		got := map[string]time.Time{}
		_ = s.View(func(tx *Tx) error {
			return tx.ForEach(func(a Allocation) error { got[a.Owner.ID] = a.Since; return nil })
		})
		return got
	}
	got := since()
	if !got["old"].Equal(past) || got["new"].Before(before) || got["new"].After(time.Now()) {
		t.Fatalf("since %v, want old at %v and new after %v", got, past, before)
	}
	// An earlier version releases .3 (leaving the time) and gives it to
	// another owner: its time is unknown, not the first owner's.
	err = s.Update(func(tx *Tx) error {
		a := ip("198.18.0.3")
		_ = tx.ips.Delete(key(a))
		_ = tx.owners.Delete(ownerKey(Owner{ID: "new", IfName: "eth0"}, a))
		other := Allocation{IP: a, Owner: Owner{ID: "other", IfName: "eth0"}}
		_ = tx.ips.Put(key(a), encode(other))
		return tx.owners.Put(ownerKey(other.Owner, a), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := since(); !got["other"].IsZero() {
		t.Fatalf("an address given again by an earlier version has time %v, want none", got["other"])
	}
	// Release forgets the time.
	err = s.Update(func(tx *Tx) error {
		_, err := tx.ReleaseOwner(Owner{ID: "old", IfName: "eth0"})
		if err == nil && tx.since.Get(key(ip("198.18.0.2"))) != nil {
			err = errors.New("the time of a released address is kept")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	all, err := ReadAll(filepath.Join(Dir(dir, testNet), DBName), time.Second)
	if err != nil || len(all) != 1 || all[0].Owner.ID != "other" || !all[0].Since.IsZero() {
		t.Fatalf("ReadAll: %+v, %v", all, err)
	}
}
