package detach

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"
)

// The test binary doubles as a plugin (envTestPlugin: start a holding child
// with the tail passed as fd 3, then exit or linger) and as that plugin's
// detached child (Run, as plugins call it first thing in main).
const envTestPlugin = "MESHWIRE_DETACH_TEST_PLUGIN"

func TestMain(m *testing.M) {
	Run(nil)
	if mode := os.Getenv(envTestPlugin); mode != "" {
		tail := os.NewFile(3, "tail")
		if err := Hold(tail); err != nil {
			os.Exit(3)
		}
		tail.Close()
		if mode == "linger" {
			time.Sleep(300 * time.Millisecond)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestDispatch(t *testing.T) {
	var got string
	jobs := map[string]Job{"a": func(arg string) error { got = arg; return nil }, "b": func(string) error { return errors.New("b failed") }}
	if err := dispatch(jobs, "a:x:y"); err != nil || got != "x:y" {
		t.Fatalf("got %q %v", got, err)
	}
	if dispatch(jobs, "b:") == nil {
		t.Fatal("the job's error is lost")
	}
	for _, bad := range []string{"", "c:1", "a"} {
		if dispatch(jobs, bad) == nil {
			t.Errorf("%q dispatched", bad)
		}
	}
}

func TestHoldJobIsBuiltIn(t *testing.T) {
	if err := dispatch(nil, holdJob+":"); err != nil {
		t.Fatalf("hold job: %v", err)
	}
}

// holdRun runs the test plugin in mode with the write end of a pipe as the
// tail it hands over, and returns when the plugin exited and when the last
// copy of the tail was closed (the read end sees EOF).
func holdRun(t *testing.T, mode string) (exited, released time.Duration) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envTestPlugin+"="+mode)
	cmd.ExtraFiles = []*os.File{w}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	done := make(chan time.Duration, 1)
	go func() {
		_, _ = io.Copy(io.Discard, r)
		done <- time.Since(start)
	}()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("plugin: %v", err)
	}
	exited = time.Since(start)
	select {
	case released = <-done:
	case <-time.After(holdLimit + 5*time.Second):
		t.Fatal("the tail was never closed")
	}
	return exited, released
}

// TestHoldEndsWithThePlugin: the holding child closes its tail once the
// plugin has exited and not before, also when the plugin exits before the
// child has even started (the common case: the plugin returns at once).
func TestHoldEndsWithThePlugin(t *testing.T) {
	exited, released := holdRun(t, "linger")
	if exited < 300*time.Millisecond {
		t.Fatalf("plugin exited after %v, before its 300ms", exited)
	}
	// (Wait may return a little after the child already saw the exit.)
	if released < 300*time.Millisecond {
		t.Fatalf("tail closed at %v, while the plugin still ran (it exits after 300ms)", released)
	}
	if released > exited+2*time.Second {
		t.Fatalf("tail closed %v after the plugin exited: the child lingered", released-exited)
	}
	for i := 0; i < 5; i++ {
		exited, released := holdRun(t, "exit")
		if released > exited+2*time.Second {
			t.Fatalf("run %d: tail closed %v after the plugin exited (limit %v): the child missed the exit", i, released-exited, holdLimit)
		}
	}
}

// TestHoldWhileThePluginLives: while the plugin runs, its holding child
// keeps the tail open.
func TestHoldWhileThePluginLives(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := Hold(w); err != nil {
		t.Fatal(err)
	}
	w.Close()
	// This test process is the plugin: its lifeline stays open until it
	// exits, and so does the child's copy of the tail.
	_ = r.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := r.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the holding child let go of its tail while the plugin lives: %v", err)
	}
}
