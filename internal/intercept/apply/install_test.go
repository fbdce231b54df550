package apply

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/intercept"
)

// TestInstall: Install's dry run writes nothing and says what it would
// do; the install itself, then a re-run that finds it in place; other
// settings refused without reconciling, with the outcome still naming the
// backend; a failed apply undone with Request.Undo.
func TestInstall(t *testing.T) {
	ctx := context.Background()
	tproxy := intercept.Default()
	tproxy.Mode = intercept.ModeTProxy
	// A pod whose first address is IPv6: IPv6 rules too.
	addrs := func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("fd42::2")}, nil }
	for _, b := range allBackends {
		t.Run(b.String(), func(t *testing.T) {
			p := newPod(b)
			req := p.req(intercept.Default(), b, false)
			req.Addrs = addrs
			req.DryRun = true
			out, err := Install(ctx, req)
			if err != nil || !strings.Contains(out.DryRun, "# backend: "+b.String()) || len(p.writes()) != 0 {
				t.Fatalf("dry run: %v, wrote %q:\n%s", err, p.writes(), out.DryRun)
			}
			req.DryRun = false
			if out, err = Install(ctx, req); err != nil || out.UpToDate || out.Backend != b || out.Mode != intercept.ModeRedirect || !out.Request.IPv6 || len(p.writes()) == 0 {
				t.Fatalf("install: %+v, %v", out, err)
			}
			if out, err = Install(ctx, req); err != nil || !out.UpToDate {
				t.Fatalf("re-run: %+v, %v", out, err)
			}
			other := p.req(tproxy, b, true)
			other.Addrs = addrs
			if out, err = Install(ctx, other); !errors.Is(err, ErrDifferent) || out.Backend != b {
				t.Fatalf("other settings: %+v, %v", out, err)
			}
			failing := newPod(b)
			failing.fakes[b].Fail = func(string) error { return errors.New("refused") }
			req = failing.req(tproxy, b, true)
			req.Addrs, req.Undo = addrs, true
			if _, err = Install(ctx, req); err == nil {
				t.Fatal("a refused apply succeeded")
			}
			if len(failing.routing.have) != 0 {
				t.Fatalf("left after the undo: %v", failing.routing.have)
			}
		})
	}
}
