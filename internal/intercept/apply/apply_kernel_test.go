//go:build kernel

package apply

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
)

// TestKernelLifecycle runs install, re-run, reconcile and cleanup against
// the kernel in a throwaway namespace, with each backend: the rules read
// back (over netlink, or legacy iptables' text) are recognised as the ones
// written, and removal by position goes through the real tools.
func TestKernelLifecycle(t *testing.T) {
	kerneltest.Require(t)
	ctx := context.Background()
	for _, b := range allBackends {
		t.Run(b.String(), func(t *testing.T) {
			if !toolsPresent(b) {
				t.Fatalf("%s is not installed (make test installs it: test/deps.sh)", b)
			}
			_, p := kerneltest.NewNS(t, "icpt-"+b.String())
			redirect := intercept.Default()
			redirect.RedirectDNS, redirect.CaptureAllDNS = true, true
			tp := tproxy(0x64, 200)
			prepare := func(c intercept.Config, reconcile bool) (*Plan, error) {
				return Prepare(ctx, Request{Config: c, IPv6: true, Backend: b, Reconcile: reconcile})
			}
			apply := func(c intercept.Config, reconcile bool) error {
				plan, err := prepare(c, reconcile)
				if err != nil {
					return err
				}
				return plan.Apply(ctx)
			}
			upToDate := func(c intercept.Config, what string) error {
				plan, err := prepare(c, false)
				if err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				if !plan.UpToDate() {
					return fmt.Errorf("%s: not recognised as installed: %v\n%s", what, plan.Status, plan)
				}
				return nil
			}
			err := netns.Enter(p, func() error {
				lo, err := netlink.LinkByName("lo")
				if err != nil {
					return err
				}
				if err := netlink.LinkSetUp(lo); err != nil {
					return err
				}
				if err := apply(redirect, false); err != nil {
					return err
				}
				if err := upToDate(redirect, "installed"); err != nil {
					return err
				}
				if err := apply(tp, true); err != nil {
					return fmt.Errorf("reconcile: %w", err)
				}
				if err := upToDate(tp, "reconciled"); err != nil {
					return err
				}
				out, err := Cleanup(ctx, Request{Config: intercept.Default()}, false)
				if err != nil {
					return err
				}
				// The mark 0x64 is found in the rules read back.
				if !strings.Contains(out, "fwmark 0x64 lookup 200") {
					return fmt.Errorf("cleanup missed the TPROXY mark's routing:\n%s", out)
				}
				plan, err := prepare(redirect, false)
				if err != nil {
					return err
				}
				for f, s := range plan.Status {
					if s != intercept.Absent {
						return fmt.Errorf("after cleanup, %s: %s\n%s", f, s, plan)
					}
				}
				if missing, err := MissingSteps(intercept.Routing(tp, true)); err != nil || len(missing) != 5 {
					return fmt.Errorf("routing left after cleanup: missing only %v (%v)", missing, err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
