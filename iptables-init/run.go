package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/meshwire/meshwire/internal/buildinfo"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/intercept/apply"
	"github.com/meshwire/meshwire/internal/intercept/flags"
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
func Run(args []string, env flags.Env, stdout, stderr io.Writer) int {
	usage := func(err error) int {
		fmt.Fprintf(stderr, "iptables-init: %v\nRun iptables-init --help for the flags. Nothing was changed.\n", err)
		return ExitUsage
	}
	o, err := flags.ParseEnv(args, env)
	if err != nil {
		return usage(err)
	}
	if o.Help {
		fmt.Fprintf(stdout, "%s\n\n%s", buildinfo.String("iptables-init"), o.Usage)
		return ExitOK
	}
	rep, closeLogs, err := newReporter(o.Log, stdout, stderr)
	if err != nil {
		return usage(fmt.Errorf("--log_target: %w", err))
	}
	defer closeLogs()
	for _, n := range o.Notes {
		rep.warn("%s", n)
	}
	if o.CNIMode && o.NetNS != "" {
		// As istio-iptables in CNI mode: the xtables lock is the pod's
		// namespace file, not the node's /run/xtables.lock (iptables
		// tools read XTABLES_LOCKFILE; only the legacy variant locks).
		os.Setenv("XTABLES_LOCKFILE", o.NetNS)
	}
	code := ExitOK
	work := func() error {
		code = execute(context.Background(), o, stdout, rep)
		return nil
	}
	if o.NetNS != "" {
		if err := netns.Enter(o.NetNS, work); err != nil {
			rep.errorf("--network-namespace: %v", err)
			return ExitFailed
		}
	} else {
		_ = work()
	}
	return code
}

// execute does what o asks in the namespace the thread is in: the
// request built from the options, then one call (apply.Install,
// apply.Cleanup) whose outcome it reports.
func execute(ctx context.Context, o flags.Options, stdout io.Writer, rep *reporter) int {
	if o.Config.RedirectDNS && !o.Config.CaptureAllDNS {
		text, err := os.ReadFile(o.ResolvConf)
		if err != nil {
			rep.errorf("--redirect-dns: read the pod's nameservers: %v", err)
			return ExitFailed
		}
		o.Config.DNSServers = intercept.ParseResolvConf(string(text))
	}
	req := apply.Request{Config: o.Config, DualStack: o.DualStack, Backend: o.Backend, Reconcile: o.Reconcile,
		Force: o.ForceApply, Fallback: o.EBPFFallback, DryRun: o.DryRun}
	if o.CleanupOnly {
		return cleanup(ctx, req, stdout, rep)
	}
	if o.SkipRuleApply {
		if err := req.ReadAddrs(); err != nil {
			rep.errorf("%v", err)
			return ExitFailed
		}
	} else {
		out, err := apply.Install(ctx, req)
		if code := reportInstall(out, err, stdout, rep); code != ExitOK || o.DryRun {
			return code
		}
		req = out.Request
	}
	if o.RunValidation && !o.DryRun {
		return validate(ctx, o, req, rep)
	}
	return ExitOK
}

// cleanup is --cleanup-only.
func cleanup(ctx context.Context, req apply.Request, stdout io.Writer, rep *reporter) int {
	out, err := apply.Cleanup(ctx, req, req.DryRun)
	if req.DryRun {
		fmt.Fprint(stdout, out)
	}
	if err != nil {
		rep.errorf("cleanup: %v", err)
		return ExitFailed
	}
	if !req.DryRun {
		rep.info("interception rules removed")
	}
	return ExitOK
}

// validate is --run-validation.
func validate(ctx context.Context, o flags.Options, req apply.Request, rep *reporter) int {
	fams := []intercept.Family{intercept.V4}
	if req.IPv6 {
		fams = append(fams, intercept.V6)
	}
	if err := apply.Validate(ctx, req.Config, fams, o.ProbePort, o.ProbeTimeout); err != nil {
		rep.errorf("validation failed: %v", err)
		return ExitValidation
	}
	rep.info("validation passed: outbound connections reach the proxy")
	return ExitOK
}
