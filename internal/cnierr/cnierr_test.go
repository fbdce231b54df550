package cnierr

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func TestCodesAndMessages(t *testing.T) {
	cases := []struct {
		err  *types.Error
		code uint
		msg  string
	}{
		{InvalidEnv("CNI_NETNS", "missing %s", "x"), 4, "CNI_NETNS: missing x"},
		{Decoding("bad"), 6, "bad"},
		{Field("ipam.ranges[0]", "overlaps %d", 1), 7, "invalid config: ipam.ranges[0]: overlaps 1"},
		{Config("a and b conflict"), 7, "invalid config: a and b conflict"},
		{TryAgain("busy"), 11, "busy"},
		{NotAvailable("no"), 50, "no"},
		{CheckFailed("lo is down"), 999, "check failed: lo is down"},
	}
	for _, c := range cases {
		if c.err.Code != c.code || c.err.Msg != c.msg {
			t.Errorf("got %d %q, want %d %q", c.err.Code, c.err.Msg, c.code, c.msg)
		}
	}
}

func TestCodeAndWrap(t *testing.T) {
	if Code(nil) != 0 || Code(errors.New("x")) != CodeInternal || Code(fmt.Errorf("ctx: %w", TryAgain("x"))) != 11 {
		t.Fatal("Code does not see through wrapping")
	}
	w := Wrap(Field("mtu", "too big"), "bridge %s", "cni0")
	if Code(w) != 7 || !strings.HasPrefix(w.Error(), "bridge cni0: invalid config: mtu") {
		t.Fatalf("Wrap lost the code or context: %v", w)
	}
	if Code(Wrap(errors.New("boom"), "x")) != CodeInternal || Wrap(nil, "x") != nil {
		t.Fatal("Wrap of plain or nil error")
	}
}

// TestCatchInGoroutine: a panic in a goroutine run through Catch comes back
// as a code-999 error, logged as a "panic" record with its stack, and the
// process goes on.
func TestCatchInGoroutine(t *testing.T) {
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewJSONHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	done := make(chan error, 1)
	go func() {
		done <- Catch(func() error {
			var m map[string]*int
			return fmt.Errorf("%d", *m["x"])
		})
	}()
	err := <-done
	if Code(err) != CodeInternal || !strings.Contains(err.Error(), "nil pointer") {
		t.Fatalf("got %v (code %d)", err, Code(err))
	}
	if !strings.Contains(buf.String(), `"msg":"panic"`) || !strings.Contains(buf.String(), "stack") {
		t.Fatalf("no panic record: %s", buf.String())
	}
	if err := Catch(func() error { return TryAgain("busy") }); Code(err) != CodeTryAgainLater {
		t.Fatalf("an error without a panic changed: %v", err)
	}
}
