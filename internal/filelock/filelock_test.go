package filelock

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshwire/meshwire/internal/cnierr"
)

func TestTimeoutIsTryAgain(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sub", "lock")
	l, err := Acquire(p, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = Acquire(p, 100*time.Millisecond)
	if cnierr.Code(err) != cnierr.CodeTryAgainLater {
		t.Fatalf("busy lock: %v (code %d), want code 11", err, cnierr.Code(err))
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 2*time.Second {
		t.Fatalf("gave up after %s, want about 100ms", d)
	}
	l.Release()
	l.Release() // twice is fine
	l2, err := Acquire(p, 100*time.Millisecond)
	if err != nil {
		t.Fatalf("lock not free after release: %v", err)
	}
	l2.Release()
}

// TestMutualExclusion: the lock really excludes (a counter incremented
// non-atomically under it never loses an update).
func TestMutualExclusion(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	var wg sync.WaitGroup
	n := 0
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 50; j++ {
				l, err := Acquire(p, 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				v := n
				time.Sleep(time.Microsecond)
				n = v + 1
				l.Release()
			}
		}()
	}
	wg.Wait()
	if n != 1000 {
		t.Fatalf("counter %d, want 1000: the lock let two holders in", n)
	}
}

// TestAcquireDir: a directory is locked in place (nothing is created in
// it), excludes a second taker until released, and a missing directory or
// a regular file is an error naming it.
func TestAcquireDir(t *testing.T) {
	dir := t.TempDir()
	l, err := AcquireDir(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := AcquireDir(dir, 50*time.Millisecond); cnierr.Code(err) != cnierr.CodeTryAgainLater {
		t.Fatalf("busy directory lock: %v, want code 11", err)
	}
	l.Release()
	l2, err := AcquireDir(dir, 50*time.Millisecond)
	if err != nil {
		t.Fatalf("directory lock not free after release: %v", err)
	}
	l2.Release()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("locking created %v in the directory", ents)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "missing"), file} {
		if _, err := AcquireDir(p, 50*time.Millisecond); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("AcquireDir(%s): %v, want an error naming it", p, err)
		}
	}
}
