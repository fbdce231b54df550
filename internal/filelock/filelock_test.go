package filelock

import (
	"path/filepath"
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
