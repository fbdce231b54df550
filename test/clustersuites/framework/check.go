package framework

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// Check is the suites' one way to report a check: what was checked, and
// err, nil when it holds. A failed check fails t and the suite goes on,
// so that one run lists every failed check; each is logged PASS or FAIL.
func Check(t testing.TB, what string, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("FAIL: %s: %v", what, err)
		return false
	}
	t.Logf("PASS: %s", what)
	return true
}

// Checkf is Check for a condition: ok, or the failure described by
// format and args.
func Checkf(t testing.TB, what string, ok bool, format string, args ...any) bool {
	t.Helper()
	if ok {
		return Check(t, what, nil)
	}
	return Check(t, what, fmt.Errorf(format, args...))
}

// Require is Check that ends the test on a failure: what follows cannot
// be judged without it.
func Require(t testing.TB, what string, err error) {
	t.Helper()
	if !Check(t, what, err) {
		t.FailNow()
	}
}

// Must ends the test when err is not nil, and says nothing otherwise: for
// the steps that set a check up (render, apply), not the checks.
func Must(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("FAIL: %s: %v", what, err)
	}
}

// Eventually calls fn every second until it returns nil or within runs
// out, and reports the outcome as one check (the last error on failure).
func Eventually(t testing.TB, what string, within time.Duration, fn func() error) bool {
	t.Helper()
	return Check(t, what, Poll(within, fn))
}

// Poll calls fn every second until it returns nil or within runs out; it
// returns the last error.
func Poll(within time.Duration, fn func() error) error {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		err := fn()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s: %w", within, err)
		case <-time.After(time.Second):
		}
	}
}

// ErrNotYet is what a condition returns while it does not hold yet.
var ErrNotYet = errors.New("not yet")
