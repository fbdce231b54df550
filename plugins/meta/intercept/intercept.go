package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/ebpf/fastpath/podrecord"
	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/intercept/apply"
	"github.com/meshwire/meshwire/internal/intercept/flags"
	"github.com/meshwire/meshwire/internal/meshedpods"
	"github.com/meshwire/meshwire/internal/netns"
)

// request is the install request of o: a repeated ADD converges on the
// config (reconcile), a failed one undoes what it did.
func request(o flags.Options) apply.Request {
	return apply.Request{Config: o.Config, DualStack: o.DualStack, Backend: o.Backend, Reconcile: true, Fallback: o.EBPFFallback, Undo: true}
}

// report logs what apply.Install did for the pod.
func report(out apply.Outcome, err error, d decision) {
	if out.FellBack != nil {
		slog.Warn("this node cannot capture the pod in ebpf mode; installing the fallback mode's rules", "mode", string(out.Mode), "error", out.FellBack)
	}
	switch {
	case out.UndoErr != nil:
		slog.Warn("undoing a failed ADD", "error", out.UndoErr)
	case err != nil:
	case out.Mode == intercept.ModeEBPF:
		slog.Info("pod registered for ebpf interception (no netfilter rule)", "why", d.Why)
	default:
		slog.Info("interception rules installed", "why", d.Why, "mode", string(out.Mode), "ipv6", out.Request.IPv6, "backend", out.Backend.String(), "alreadyInPlace", out.UpToDate)
	}
}

// chained decodes the config of ADD and CHECK, which need a prevResult
// (whose nameservers --redirect-dns captures), and decides for the pod.
func chained(args *skel.CmdArgs) (*config, flags.Options, decision, *current.Result, error) {
	conf, o, d, err := parsePodConfig(args.StdinData, args.Args)
	if err != nil {
		return nil, o, d, nil, err
	}
	prev, err := conf.RequirePrevResult()
	if err != nil {
		return nil, o, d, nil, err
	}
	if o.Config.RedirectDNS && !o.Config.CaptureAllDNS {
		o.Config.DNSServers = dnsServers(prev)
	}
	return conf, o, d, prev, nil
}

func cmdAdd(args *skel.CmdArgs) error {
	conf, o, d, prev, err := chained(args)
	if err != nil {
		return err
	}
	if meshedpods.Repairing() {
		// The node agent's repair: held against the pod's DEL, which
		// waits for it, and only in the namespace recorded at ADD.
		_, release, err := meshedpods.LockForRepair("", args.ContainerID, args.IfName)
		if errors.Is(err, meshedpods.ErrGone) {
			slog.Info("the node agent's repair found the pod's DEL done; nothing to repair")
			return types.PrintResult(prev, conf.CNIVersion)
		}
		if err != nil {
			return cnierr.Wrap(err, "repair the pod's interception")
		}
		defer release()
	}
	if !d.Intercept {
		slog.Info("pod not intercepted", "why", d.Why)
		if d.Fastpath != nil {
			// Its init container installs the rules; the fast path's
			// policy is still the plugin's to write.
			err := netns.Enter(args.Netns, func() error { setFastpathPolicy(args, *d.Fastpath, nil); return nil })
			if err != nil {
				return cnierr.Wrap(err, "enter %s", args.Netns)
			}
		}
		if !meshedpods.Repairing() {
			if err := ambientAdd(args, d.Pod, prev); err != nil {
				return err
			}
		}
		return types.PrintResult(prev, conf.CNIVersion)
	}
	err = netns.Enter(args.Netns, func() error {
		out, err := apply.Install(context.Background(), request(o))
		report(out, err, d)
		if err == nil && d.Fastpath != nil {
			setFastpathPolicy(args, *d.Fastpath, &out.Request)
		}
		return err
	})
	if err != nil {
		return cnierr.Wrap(err, "install interception rules in %s", args.Netns)
	}
	keepCall(args)
	return types.PrintResult(prev, conf.CNIVersion)
}

// keepCall records the runtime's ADD of a pod whose interception the
// plugin installed, so that the node agent checks it every interval and
// repeats it when the pod's rules went (meshedpods). A failure is logged:
// the pod is meshed, only not watched.
func keepCall(args *skel.CmdArgs) {
	if meshedpods.Repairing() {
		return
	}
	c := meshedpods.Call{ContainerID: args.ContainerID, Netns: args.Netns, IfName: args.IfName, Args: args.Args, Config: args.StdinData}
	var err error
	if c.NetnsIno, c.NetnsDev, err = netns.Identify(args.Netns); err == nil {
		err = meshedpods.Write("", c)
	}
	if err != nil {
		slog.Warn("could not record the pod for the node agent's checks: drift in its interception will not be repaired", "error", err)
	}
}

func cmdDel(args *skel.CmdArgs) error {
	_, o, err := parseConfig(args.StdinData)
	if err != nil {
		return err
	}
	if err := meshedpods.Remove("", args.ContainerID, args.IfName); err != nil {
		return cnierr.Wrap(err, "remove the pod's intercept call")
	}
	if err := ambientDel(args); err != nil {
		return err
	}
	if err := podrecord.Remove("", podrecord.Name(args.ContainerID, args.IfName)); err != nil {
		return cnierr.Wrap(err, "remove the pod's fast-path record")
	}
	if args.Netns == "" {
		return nil // the rules lived in the namespace, gone with it
	}
	err = netns.Enter(args.Netns, func() error {
		if err := podpolicy.Forget(""); err != nil {
			slog.Warn("could not remove the pod's fast-path policy (the map's LRU lets it go first)", "error", err)
		}
		if err := pods.Forget(loader.RulesDir("")); err != nil {
			slog.Warn("could not remove the fast path's copy of the pod's interception settings (the node agent collects it)", "error", err)
		}
		_, err := apply.Cleanup(context.Background(), apply.Request{Config: o.Config}, false)
		return err
	})
	if netns.IsGone(err) {
		slog.Info("pod namespace gone; nothing to remove", "error", err)
		return nil
	}
	return cnierr.Wrap(err, "remove interception rules in %s", args.Netns)
}

func cmdCheck(args *skel.CmdArgs) error {
	_, o, d, _, err := chained(args)
	if err != nil {
		return err
	}
	if d.InitContainer {
		return nil // the rules are the pod's init container's
	}
	return netns.Enter(args.Netns, func() error {
		req := apply.Request{Config: o.Config, DualStack: o.DualStack, Backend: o.Backend}
		if err := req.ReadAddrs(); err != nil {
			return err
		}
		if d.Intercept && o.Config.Mode == intercept.ModeEBPF {
			err := apply.CheckEBPF(req)
			switch {
			case err == nil:
				return nil
			case o.EBPFFallback == "" || apply.EBPFRegistered():
				return cnierr.CheckFailed("%s: %v", args.Netns, err)
			}
			// Not registered, with a fallback: ADD installed its rules.
			req.Config.Mode = o.EBPFFallback
		}
		plan, err := apply.Prepare(context.Background(), req)
		if !d.Intercept {
			// ADD left this pod alone: there must be nothing.
			switch {
			case errors.Is(err, apply.ErrDifferent) || (err == nil && (plan.UpToDate() || plan.Partial())):
				return cnierr.CheckFailed("interception rules in %s, which is not intercepted (%s)", args.Netns, d.Why)
			case err != nil:
				return cnierr.Wrap(err, "read the interception rules")
			}
			return nil
		}
		if errors.Is(err, apply.ErrDifferent) {
			return cnierr.CheckFailed("%v", err)
		}
		if err != nil {
			return cnierr.Wrap(err, "read the interception rules")
		}
		if !plan.UpToDate() {
			return cnierr.CheckFailed("interception rules are missing in %s (%s)", args.Netns, plan.Backend)
		}
		missing, err := apply.MissingSteps(plan.Add)
		if err != nil {
			return cnierr.Wrap(err, "read the policy routing")
		}
		if len(missing) > 0 {
			return cnierr.CheckFailed("missing in %s: %s", args.Netns, missing[0])
		}
		return nil
	})
}

// setFastpathPolicy records the fast path's policy for the pod whose
// namespace the thread is in, and with req (the interception installed
// here) the copy of its settings by which the fast path tracks only the
// connections they capture (podrecord: attach replays the records), and
// writes both when the fast path is attached. A failure is logged, not
// returned: the pod works without the fast path, and a pod with no policy
// gets the safe default (only its application is fed); one with no copy
// has all its connections tracked.
func setFastpathPolicy(args *skel.CmdArgs, p podpolicy.Policy, req *apply.Request) {
	rec := podrecord.Record{Policy: p}
	var err error
	if rec.Netns, err = netns.Cookie(); err == nil {
		rec.NetnsIno, err = netns.Inode()
	}
	if err != nil {
		slog.Warn("could not name the pod's namespace for the fast path: it gets the default (only the application is fed)", "error", err)
		return
	}
	if req != nil {
		s, err := apply.MirrorOf(req.Config, req.Local)
		if err == nil {
			rec.Mirror = &s
		} else {
			slog.Info("the fast path tracks every connection of the pod: ebpf interception's settings cannot express its interception", "error", err)
		}
	}
	if err := podrecord.Write("", podrecord.Name(args.ContainerID, args.IfName), rec); err != nil {
		slog.Warn("could not record the pod's fast-path policy: a later attach will not know it", "error", err)
	}
	attached, err := podrecord.Apply("", rec)
	switch {
	case err != nil:
		slog.Warn("could not write the pod's fast-path policy and settings copy: it gets the default (only the application is fed, every connection tracked)", "error", err)
	case !attached:
		return
	default:
		slog.Info("fast-path policy written", "intoProxy", p.IntoProxy, "noPeer", p.NoPeer, "settingsCopied", rec.Mirror != nil)
		if rec.Mirror != nil {
			return
		}
	}
	// No copy (the rules are the init container's, or the copy failed):
	// an earlier one would mirror settings the pod no longer has.
	if err := pods.Forget(loader.RulesDir("")); err != nil {
		slog.Warn("remove the fast path's earlier copy of the pod's settings", "error", err)
	}
}

// cmdStatus reports whether the firewall tools work on this node.
func cmdStatus(args *skel.CmdArgs) error {
	_, o, err := parseConfig(args.StdinData)
	if err != nil {
		return err
	}
	b := o.Backend
	ctx := context.Background()
	if b.Kind == "" {
		b = firewall.Detect(ctx)
	}
	return b.Available(ctx)
}

// cmdGC has nothing to collect: every rule lives in a pod's namespace and
// goes with it. The records of the pods' namespaces (podnetns) are the
// node agent's to collect once their namespace is gone: they are kept for
// every network, and GC names the attachments of one.
func cmdGC(args *skel.CmdArgs) error {
	_, _, err := parseConfig(args.StdinData)
	return err
}
