package main

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/intercept/apply"
	"github.com/meshwire/meshwire/internal/intercept/flags"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/podstate"
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
	store := podstate.Default()
	name := podstate.Name(args.ContainerID, args.IfName)
	repairing := podstate.Repairing()
	if repairing {
		// The node agent's repair: held against the pod's DEL, which
		// waits for it, and only in the namespace recorded at ADD.
		_, release, err := store.LockForRepair(name)
		if errors.Is(err, podstate.ErrGone) {
			slog.Info("the node agent's repair found the pod's DEL done; nothing to repair")
			return types.PrintResult(prev, conf.CNIVersion)
		}
		if err != nil {
			return cnierr.Wrap(err, "repair the pod's interception")
		}
		defer release()
	}
	rec := newRecord(args, conf, d, prev)
	if !d.Intercept {
		slog.Info("pod not intercepted", "why", d.Why)
		if d.Fastpath != nil {
			// Its init container installs the rules; the fast path's
			// policy is still the plugin's to write.
			err := netns.Enter(args.Netns, func() error { rec.Fastpath = fastpathOf(*d.Fastpath, nil); return nil })
			if err != nil {
				return cnierr.Wrap(err, "enter %s", args.Netns)
			}
		}
		if repairing {
			applyFastpath(rec)
			return types.PrintResult(prev, conf.CNIVersion)
		}
		ambient := ambientOn(store) && rec.Kubernetes()
		if ambient || rec.Fastpath != nil {
			if err := store.Put(rec); err != nil {
				return cnierr.Wrap(err, "record the pod for the node agent")
			}
		}
		if ambient {
			if err := ambientAdd(store, rec, d.Pod); err != nil {
				return err
			}
		}
		applyFastpath(rec)
		return types.PrintResult(prev, conf.CNIVersion)
	}
	err = netns.Enter(args.Netns, func() error {
		out, err := apply.Install(context.Background(), request(o))
		report(out, err, d)
		if err == nil && d.Fastpath != nil {
			rec.Fastpath = fastpathOf(*d.Fastpath, &out.Request)
		}
		return err
	})
	if err != nil {
		return cnierr.Wrap(err, "install interception rules in %s", args.Netns)
	}
	if !repairing {
		// The call, for the node agent's checks: repeated when the pod's
		// rules went. A failure is logged: the pod is meshed, only not
		// watched.
		rec.Call = &podstate.Call{Args: args.Args, Config: args.StdinData}
		if err := store.Put(rec); err != nil {
			slog.Warn("could not record the pod for the node agent: drift in its interception will not be repaired, a later fast path will not know its policy", "error", err)
		}
	}
	applyFastpath(rec)
	return types.PrintResult(prev, conf.CNIVersion)
}

// newRecord is the pod's record (package podstate) as the runtime's ADD
// describes it: the attachment, its namespace's identity, and the
// Kubernetes pod's names, addresses and Istio annotations.
func newRecord(args *skel.CmdArgs, conf *config, d decision, prev *current.Result) podstate.Record {
	r := podstate.Record{ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns, Network: conf.Name}
	if err := r.Identify(); err != nil {
		slog.Warn("could not identify the pod's namespace", "error", err)
	}
	p := d.Pod
	if p.Kubernetes && p.Name != "" && p.Namespace != "" {
		r.UID, r.Namespace, r.Name = p.UID, p.Namespace, p.Name
		r.Annotations = podstate.IstioAnnotations(p.Annotations)
		for _, ip := range prev.IPs {
			if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
				r.IPs = append(r.IPs, a.Unmap())
			}
		}
	}
	return r
}

// removeRecord removes the pod's record, once a repair of the pod is
// done, and what a plugin of an earlier version recorded of it.
func removeRecord(store podstate.Store, args *skel.CmdArgs) error {
	name := podstate.Name(args.ContainerID, args.IfName)
	if err := store.RemoveLegacy(name); err != nil {
		return cnierr.Wrap(err, "remove what an earlier version recorded of the pod")
	}
	return cnierr.Wrap(store.Remove(name), "remove the pod's record")
}

func cmdDel(args *skel.CmdArgs) error {
	_, o, err := parseConfig(args.StdinData)
	if err != nil {
		return err
	}
	store := podstate.Default()
	if err := removeRecord(store, args); err != nil {
		return err
	}
	ambientDel(store, args)
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

// fastpathOf is the fast path's section of the pod's record for policy p
// in the namespace the thread is in, and with req (the interception
// installed here) the copy of its settings by which the fast path tracks
// only the connections they capture. A failure is logged, not returned:
// the pod works without the fast path, and a pod with no policy gets the
// safe default (only its application is fed); one with no copy has all
// its connections tracked.
func fastpathOf(p podpolicy.Policy, req *apply.Request) *podstate.Fastpath {
	f := &podstate.Fastpath{Policy: p}
	var err error
	if f.Cookie, err = netns.Cookie(); err != nil {
		slog.Warn("could not name the pod's namespace for the fast path: it gets the default (only the application is fed)", "error", err)
		return nil
	}
	if req != nil {
		s, err := apply.MirrorOf(req.Config, req.Local, req.IPv6)
		if err == nil {
			f.Mirror = &s
		} else {
			slog.Info("the fast path tracks every connection of the pod: ebpf interception's settings cannot express its interception", "error", err)
		}
	}
	return f
}

// applyFastpath writes the pod's fast-path policy and settings copy into
// the fast path when it is attached (a fast path attached later gets them
// from the pod's record). A failure is logged.
func applyFastpath(r podstate.Record) {
	f := r.Fastpath
	if f == nil {
		return
	}
	attached, err := f.Apply("", r.NetnsIno)
	switch {
	case err != nil:
		slog.Warn("could not write the pod's fast-path policy and settings copy: it gets the default (only the application is fed, every connection tracked)", "error", err)
	case !attached:
		return
	default:
		slog.Info("fast-path policy written", "intoProxy", f.Policy.IntoProxy, "noPeer", f.Policy.NoPeer, "settingsCopied", f.Mirror != nil)
		if f.Mirror != nil {
			return
		}
	}
	// No copy (the rules are the init container's, or the copy failed):
	// an earlier one would mirror settings the pod no longer has.
	if err := pods.ForgetStale(loader.RulesDir(""), f.Cookie, r.NetnsIno); err != nil {
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

// cmdGC removes the records (package podstate) of this network's
// attachments that the runtime no longer has: the rules lived in the
// pods' namespaces and went with them, and the node agent collects what
// the fast path kept of them.
func cmdGC(args *skel.CmdArgs) error {
	conf, _, err := parseConfig(args.StdinData)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, a := range conf.ValidAttachments {
		keep[podstate.Name(a.ContainerID, a.IfName)] = true
	}
	store := podstate.Default()
	recs, err := store.List()
	if err != nil {
		return cnierr.Wrap(err, "read the pods' records")
	}
	var errs []error
	for name, r := range recs {
		if r.Network == conf.Name && !keep[name] {
			errs = append(errs, store.Remove(name))
		}
	}
	return cnierr.Wrap(errors.Join(errs...), "remove the records of attachments gone")
}
