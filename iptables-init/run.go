package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
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

func execute(ctx context.Context, o flags.Options, stdout io.Writer, rep *reporter) int {
	fail := func(format string, a ...any) int {
		rep.errorf(format, a...)
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
	addrs, err := apply.LocalAddrs()
	if err != nil {
		return fail("list the pod's addresses: %v", err)
	}
	ipv6 := apply.WantIPv6(o.DualStack, addrs)

	if o.CleanupOnly {
		return cleanup(ctx, cfg, o.DryRun, stdout, rep)
	}
	if !o.SkipRuleApply {
		if code := install(ctx, o, cfg, ipv6, addrs, stdout, rep); code != ExitOK || o.DryRun {
			return code
		}
	}
	if o.RunValidation && !o.DryRun {
		return validate(ctx, o, cfg, ipv6, rep)
	}
	return ExitOK
}

// cleanup is --cleanup-only.
func cleanup(ctx context.Context, cfg intercept.Config, dryRun bool, stdout io.Writer, rep *reporter) int {
	out, err := apply.Cleanup(ctx, apply.Request{Config: cfg}, dryRun)
	if dryRun {
		fmt.Fprint(stdout, out)
	}
	if err != nil {
		rep.errorf("cleanup: %v", err)
		return ExitFailed
	}
	if !dryRun {
		rep.info("interception rules removed")
	}
	return ExitOK
}

// install installs the rules (or, with --dry-run, prints what it would do).
func install(ctx context.Context, o flags.Options, cfg intercept.Config, ipv6 bool, local []netip.Addr, stdout io.Writer, rep *reporter) int {
	req := apply.Request{Config: cfg, IPv6: ipv6, Backend: o.Backend, Reconcile: o.Reconcile, Force: o.ForceApply, Local: local}
	if cfg.Mode == intercept.ModeEBPF {
		if code, done := installEBPF(ctx, o, req, stdout, rep); done {
			return code
		}
		req.Config.Mode = o.EBPFFallback
	}
	plan, err := apply.Prepare(ctx, req)
	if o.DryRun && plan != nil {
		fmt.Fprint(stdout, plan.String())
	}
	if err != nil {
		if errors.Is(err, apply.ErrDifferent) {
			rep.errorf("%v. Nothing was changed.", err)
		} else {
			rep.errorf("%v", err)
		}
		return ExitFailed
	}
	if o.DryRun {
		return ExitOK
	}
	upToDate := plan.UpToDate()
	// With the rules in place, Apply only makes sure the policy routing is
	// there too.
	if err := plan.Apply(ctx); err != nil {
		rep.errorf("%v", err)
		return ExitFailed
	}
	if upToDate {
		rep.info("rules already installed (%s), nothing to do", plan.Backend)
		return ExitOK
	}
	fams := "IPv4"
	if ipv6 {
		fams = "IPv4 and IPv6"
	}
	rep.info("%s interception installed for %s with %s", cfg.Mode, fams, plan.Backend)
	return ExitOK
}

// installEBPF is install in EBPF mode: the pod registered in the node's
// eBPF maps, no rule.
// installEBPF installs EBPF mode; not done where the node cannot capture
// the pod and --ebpf-fallback names the mode to install instead.
func installEBPF(ctx context.Context, o flags.Options, req apply.Request, stdout io.Writer, rep *reporter) (code int, done bool) {
	if o.DryRun {
		fmt.Fprint(stdout, apply.DescribeEBPF(req))
		return ExitOK, true
	}
	err := apply.InstallEBPF(ctx, req)
	switch {
	case err == nil:
		rep.info("EBPF interception installed (no netfilter rule in the namespace)")
		return ExitOK, true
	case o.EBPFFallback != "" && apply.EBPFUnavailable(err):
		rep.warn("%v; installing %s rules instead (--ebpf-fallback)", err, o.EBPFFallback)
		return 0, false
	}
	rep.errorf("%v", err)
	return ExitFailed, true
}

// validate is --run-validation.
func validate(ctx context.Context, o flags.Options, cfg intercept.Config, ipv6 bool, rep *reporter) int {
	fams := []intercept.Family{intercept.V4}
	if ipv6 {
		fams = append(fams, intercept.V6)
	}
	if err := apply.Validate(ctx, cfg, fams, o.ProbePort, o.ProbeTimeout); err != nil {
		rep.errorf("validation failed: %v", err)
		return ExitValidation
	}
	rep.info("validation passed: outbound connections reach the proxy")
	return ExitOK
}
