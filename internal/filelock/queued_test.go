package filelock

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/meshwire/meshwire/internal/cnierr"
)

func TestAcquireQueued(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "lock")
	held, err := AcquireQueued(path, time.Second)
	if err != nil {
		t.Fatalf("free lock: %v", err)
	}

	// Held: the bound ends the wait with code 11.
	if _, err := AcquireQueued(path, 100*time.Millisecond); cnierr.Code(err) != cnierr.CodeTryAgainLater {
		t.Fatalf("held lock: %v, want code 11", err)
	}

	// A waiter gets the lock when the holder lets go.
	got := make(chan error, 1)
	go func() {
		l, err := AcquireQueued(path, 10*time.Second)
		if err == nil {
			l.Release()
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	held.Release()
	if err := <-got; err != nil {
		t.Fatalf("queued waiter: %v", err)
	}

	// The wait given up on above released what the kernel granted it
	// afterwards: the lock is free now.
	l, err := Acquire(path, 2*time.Second)
	if err != nil {
		t.Fatalf("lock after an abandoned wait: %v", err)
	}
	l.Release()
}
