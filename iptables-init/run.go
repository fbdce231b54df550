package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/meshwire/meshwire/internal/buildinfo"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/intercept/flags"
	"github.com/meshwire/meshwire/internal/intercept/install"
	"github.com/meshwire/meshwire/internal/netns"
)

// Exit statuses.
const (
	ExitOK         = 0
	ExitFailed     = 1
	ExitUsage      = 2
	ExitValidation = 126
)

// Run is the whole command: parse, then install, clean up or validate in
// the pod's namespace. It returns the exit status.
func Run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	o, err := flags.Parse(args, getenv)
	if err != nil {
		fmt.Fprintf(stderr, "iptables-init: %v\nRun iptables-init --help for the flags. Nothing was changed.\n", err)
		return ExitUsage
	}
	if o.Help {
		fmt.Fprintf(stdout, "%s\n\n%s", buildinfo.String("iptables-init"), o.Usage)
		return ExitOK
	}
	code := ExitOK
	work := func() error {
		code = execute(context.Background(), o, stdout, stderr)
		return nil
	}
	if o.NetNS != "" {
		if err := netns.Enter(o.NetNS, work); err != nil {
			fmt.Fprintf(stderr, "iptables-init: --network-namespace: %v\n", err)
			return ExitFailed
		}
	} else {
		_ = work()
	}
	return code
}

func execute(ctx context.Context, o flags.Options, stdout, stderr io.Writer) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "iptables-init: "+format+"\n", a...)
		return ExitFailed
	}
	cfg := o.Config
	if cfg.RedirectDNS && !cfg.CaptureAllDNS {
		text, err := os.ReadFile(o.ResolvConf)
		if err != nil {
			return fail("--redirect-dns: read the pod's nameservers: %v", err)
		}
		cfg.DNSServers = intercept.ParseResolvConf(string(text))
	}
	addrs, err := install.LocalAddrs()
	if err != nil {
		return fail("list the pod's addresses: %v", err)
	}
	ipv6 := install.WantIPv6(o.DualStack, addrs)

	if o.CleanupOnly {
		out, err := install.Cleanup(ctx, cfg, o.DryRun)
		if o.DryRun {
			fmt.Fprint(stdout, out)
		}
		if err != nil {
			return fail("cleanup: %v", err)
		}
		if !o.DryRun {
			fmt.Fprintln(stderr, "iptables-init: interception rules removed")
		}
		return ExitOK
	}
	if !o.SkipRuleApply {
		plan, err := install.Prepare(ctx, install.Request{Config: cfg, IPv6: ipv6, Backend: o.Backend, Reconcile: o.Reconcile})
		if o.DryRun && plan != nil {
			fmt.Fprint(stdout, plan.String())
		}
		if err != nil {
			if errors.Is(err, install.ErrDifferent) {
				return fail("%v. Nothing was changed.", err)
			}
			return fail("%v", err)
		}
		if o.DryRun {
			return ExitOK
		}
		upToDate := plan.UpToDate()
		// With the rules in place, Apply only makes sure the policy
		// routing is there too.
		if err := plan.Apply(ctx); err != nil {
			return fail("%v", err)
		}
		if upToDate {
			fmt.Fprintf(stderr, "iptables-init: rules already installed (%s), nothing to do\n", plan.Backend)
		} else {
			fams := "IPv4"
			if ipv6 {
				fams = "IPv4 and IPv6"
			}
			fmt.Fprintf(stderr, "iptables-init: %s interception installed for %s with %s\n", cfg.Mode, fams, plan.Backend)
		}
	}
	if o.RunValidation && !o.DryRun {
		fams := []intercept.Family{intercept.V4}
		if ipv6 {
			fams = append(fams, intercept.V6)
		}
		if err := install.Validate(ctx, cfg, fams, o.ProbePort, o.ProbeTimeout); err != nil {
			fmt.Fprintf(stderr, "iptables-init: validation failed: %v\n", err)
			return ExitValidation
		}
		fmt.Fprintln(stderr, "iptables-init: validation passed: outbound connections reach the proxy")
	}
	return ExitOK
}
