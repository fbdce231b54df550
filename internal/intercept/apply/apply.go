// Package apply installs meshwire's interception into the network
// namespace the calling thread is in. Install is the one entry point:
// iptables-init and the intercept CNI plugin both call it and only report
// its Outcome. It reads the namespace's addresses, then installs EBPF
// mode's registration (ebpf.go) or, in another mode (or in the fallback
// mode where the node cannot capture the pod), the rules: what every
// firewall backend holds is read back as typed rules through the
// firewall front door (firewall.Interface: netlink for nf_tables, legacy
// iptables' text only for the tables the namespace loaded), the pure plan
// step Operations (plan.go) turns that and the wanted config into the
// operations (one transaction per family, or one nftables transaction;
// the routing to add and remove; the removal from other backends), and
// Plan.Apply applies them with the TPROXY policy routing (routing.go,
// netlink), undone on failure when Request.Undo asks. A dry run returns
// the plan as text instead (dryrun.go); Cleanup (cleanup.go) removes
// everything. Tests give it fwfake.Fakes (Request.Firewall), routing in
// memory (Request.Routing) and addresses (Request.Addrs).
//
// docs/architecture.md ("One interception, top to bottom") lists the
// path iptables-init's arguments take from Run through this package.
package apply

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/killpoint"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// ErrDifferent is returned by Prepare (and so Install) when other
// interception rules are installed and reconciling was not asked for.
var ErrDifferent = errors.New("interception rules with other settings are already installed")

// Request is what to install.
type Request struct {
	Config intercept.Config
	// IPv6 asks for IPv6 rules; Install sets it from the namespace's
	// addresses and DualStack (WantIPv6).
	IPv6 bool
	// DualStack (--dual-stack) asks for IPv6 rules where the namespace
	// has any IPv6 address, not only where its first address is one.
	DualStack bool
	// Backend forces a firewall backend; the zero value detects the one
	// the namespace already uses.
	Backend firewall.Backend
	// Reconcile replaces rules installed with other settings.
	Reconcile bool
	// Local are the namespace's addresses (LocalAddrs), for EBPF mode:
	// connections to them stay on lo.
	Local []netip.Addr
	// Force (istio's --force-apply) writes the rule set even when it is
	// already installed as asked, and replaces other rules as Reconcile
	// does: each table is rewritten in one transaction, never doubled.
	Force bool
	// Fallback is the mode Install installs instead of EBPF mode where
	// the node cannot capture the pod (EBPFUnavailable); "" fails there.
	Fallback intercept.Mode
	// DryRun: Install changes nothing and says what it would do.
	DryRun bool
	// Undo: a failed Install removes what it installed (Cleanup).
	Undo bool

	// Firewall opens the firewall of a backend in the namespace, or
	// returns nil when that backend is not installed. Nil means the real
	// one (firewall.New; a backend other than the one installed to counts
	// when its tools are in PATH). Tests pass Fakes.
	Firewall func(firewall.Backend) firewall.Interface
	// Addrs lists the namespace's addresses; nil means LocalAddrs.
	Addrs func() ([]netip.Addr, error)
	// Routing applies and removes the policy routing; nil means netlink,
	// in the calling thread's namespace.
	Routing Routing
	// ForgetEBPF removes the pod's EBPF-mode registration and inbound
	// filters, when there are any; nil means the node's (package pods),
	// in the calling thread's namespace.
	ForgetEBPF func() error
}

func (r *Request) forgetEBPF() error {
	if r.ForgetEBPF != nil {
		return r.ForgetEBPF()
	}
	return forgetEBPF()
}

// open returns the firewall of b; nil when b is not installed (only asked
// for backends other than the one installed to: for that one, the tools'
// own errors tell).
func (r *Request) open(b firewall.Backend, installTo bool) firewall.Interface {
	if r.Firewall != nil {
		return r.Firewall(b)
	}
	if !installTo && !toolsPresent(b) {
		return nil
	}
	return firewall.New(b)
}

func (r *Request) routing() Routing {
	if r.Routing != nil {
		return r.Routing
	}
	return netlinkRouting{}
}

// Outcome is what Install did, for its caller to report.
type Outcome struct {
	// Mode is the mode installed: the request's, or its Fallback where
	// the node could not capture the pod in EBPF mode.
	Mode intercept.Mode
	// FellBack is why EBPF mode was not installed, when Mode is the
	// fallback.
	FellBack error
	// Backend is the firewall the rules went into (none in EBPF mode).
	Backend firewall.Backend
	// UpToDate: the rules were already installed as asked.
	UpToDate bool
	// DryRun is what Install would do, with Request.DryRun.
	DryRun string
	// UndoErr is why undoing a failed install (Request.Undo) failed.
	UndoErr error
	// Request is the request as Install carried it out: the namespace's
	// addresses read, Config.Mode the mode installed.
	Request Request
}

// ReadAddrs sets r.Local to the namespace's addresses, and r.IPv6 from
// them (WantIPv6).
func (r *Request) ReadAddrs() error {
	read := LocalAddrs
	if r.Addrs != nil {
		read = r.Addrs
	}
	addrs, err := read()
	if err != nil {
		return fmt.Errorf("list the pod's addresses: %w", err)
	}
	r.Local, r.IPv6 = addrs, WantIPv6(r.DualStack, addrs)
	return nil
}

// Install is the one way interception goes into the namespace of the
// calling thread. It reads the namespace's addresses (ReadAddrs), then
// registers the pod for EBPF mode (InstallEBPF), or installs the rules of
// another mode, or of req.Fallback where the node cannot capture the pod
// in EBPF mode: it reads what is installed and plans the change (Prepare,
// with Operations), applies it (Plan.Apply) and, with req.Undo,
// removes it again when that fails (Cleanup). With req.DryRun it changes
// nothing and the Outcome says what it would do. The Outcome is filled as
// far as Install got, also when it fails.
func Install(ctx context.Context, req Request) (out Outcome, err error) {
	out.Mode = req.Config.Mode
	defer func() { out.Request = req }() // as carried out, whatever the return
	if err := req.ReadAddrs(); err != nil {
		return out, err
	}
	if out.Mode == intercept.ModeEBPF {
		if req.DryRun {
			out.DryRun = DescribeEBPF(req)
			return out, nil
		}
		err := InstallEBPF(ctx, req)
		if err == nil || req.Fallback == "" || !EBPFUnavailable(err) {
			return out, err
		}
		out.Mode, out.FellBack = req.Fallback, err
		req.Config.Mode = req.Fallback
	}
	// A repeated install converges on the config: same rules, nothing
	// done; other rules (with Reconcile), replaced without a gap.
	plan, err := Prepare(ctx, req)
	if plan != nil {
		out.Backend = plan.Backend
		if req.DryRun {
			out.DryRun = plan.String()
		}
	}
	if err != nil || req.DryRun {
		return out, err
	}
	out.UpToDate = plan.UpToDate()
	killpoint.Here("planned")
	// With the rules in place, Apply only makes sure the policy routing
	// is there too.
	if err := plan.Apply(ctx); err != nil {
		if req.Undo {
			_, out.UndoErr = Cleanup(ctx, req, false)
		}
		return out, err
	}
	return out, nil
}

// Plan is what Apply will do; String shows it (dry run): the operations
// Operations gives, and the firewall to apply them to.
type Plan struct {
	Backend firewall.Backend
	Ops
	// Others are the backends other than Backend that hold meshwire's
	// rules: reconciling removes them there.
	Others []firewall.Backend
	// Forced is set when the rules are rewritten whatever is installed.
	Forced bool

	fw         firewall.Interface
	others     []*holding
	elsewhere  [][]*ruleset.Tx // the removal of what each of others holds
	routing    Routing
	forgetEBPF func() error
}

// UpToDate reports whether everything is already installed as asked.
func (p *Plan) UpToDate() bool {
	if p.Forced {
		return false
	}
	for _, s := range p.Status {
		if s != intercept.Current {
			return false
		}
	}
	return len(p.Others) == 0
}

// Partial reports whether a family holds part of the planned rules: an
// install cut short (intercept.Partial).
func (p *Plan) Partial() bool {
	for _, s := range p.Status {
		if s == intercept.Partial {
			return true
		}
	}
	return false
}

// bothFamilies: rules of the family not in use are removed, so both are
// always read.
var bothFamilies = []intercept.Family{intercept.V4, intercept.V6}

// Prepare reads the installed state and plans the change (Operations).
// It fails with ErrDifferent (wrapped, with details) when other rules of
// meshwire's or istio-iptables' are there and req.Reconcile is false.
func Prepare(ctx context.Context, req Request) (*Plan, error) {
	b := req.Backend
	if b.Kind == "" {
		b = firewall.Detect(ctx)
	}
	b.Variant = resolveVariant(b)
	if b.Kind != firewall.IPTables && b.Kind != firewall.NFTables {
		return nil, fmt.Errorf("unknown firewall backend %q", b.Kind)
	}
	p := &Plan{Backend: b, Forced: req.Force, routing: req.routing(), forgetEBPF: req.forgetEBPF}
	if p.fw = req.open(b, true); p.fw == nil {
		return nil, fmt.Errorf("firewall backend %s is not installed", b)
	}
	// Reads only: release the netlink socket now, Apply opens another.
	defer release(p.fw)
	have := read(ctx, b, p.fw)
	for _, f := range bothFamilies {
		if err := have.errs[f]; err != nil {
			if f == intercept.V6 && !req.IPv6 {
				continue // nothing to read there, and no wish for it
			}
			return nil, err
		}
	}
	var others []*holding
	var othersHeld []*Held
	for _, o := range allBackends {
		if o == b {
			continue
		}
		if fw := req.open(o, false); fw != nil {
			h := read(ctx, o, fw)
			release(fw)
			others, othersHeld = append(others, h), append(othersHeld, &h.Held)
		}
	}
	p.Ops = Operations(&have.Held, othersHeld, Want{Config: req.Config, IPv6: req.IPv6, NFTables: b.Kind == firewall.NFTables, Force: req.Force})
	for i, h := range others {
		if len(p.Elsewhere[i]) > 0 {
			p.Others, p.others = append(p.Others, h.b), append(p.others, h)
			p.elsewhere = append(p.elsewhere, p.Elsewhere[i])
		}
	}
	var diff []string
	for _, f := range p.Different {
		diff = append(diff, fmt.Sprintf("%s (%s)", f, b))
	}
	for _, o := range p.Others {
		diff = append(diff, o.String())
	}
	if len(diff) > 0 && !req.Reconcile && !req.Force {
		return p, fmt.Errorf("%w: %s; run with --reconcile to replace them, or --cleanup-only to remove them", ErrDifferent, strings.Join(diff, ", "))
	}
	return p, nil
}

// release ends a firewall's use; a socket whose close waits for the
// kernel to free what was removed is closed here (a pod's interception
// rules are few).
func release(fw firewall.Interface) {
	if f := fw.Release(); f != nil {
		_ = f.Close()
	}
}

// Apply makes the change: routing first (so that marked packets have
// somewhere to go the moment TPROXY rules exist), then the firewall
// transaction(s), then the removal of what the new rule set no longer
// needs.
func (p *Plan) Apply(ctx context.Context) error {
	defer release(p.fw)
	if err := p.routing.Apply(p.Add); err != nil {
		return err
	}
	killpoint.Here("routing")
	for _, f := range bothFamilies {
		if p.Restore[f].Empty() {
			continue
		}
		if err := p.fw.Apply(ctx, p.Restore[f]); err != nil {
			return fmt.Errorf("apply %s rules: %w", f, err)
		}
		killpoint.Here("rules " + f.String())
	}
	if !p.Nft.Empty() {
		if err := p.fw.Apply(ctx, p.Nft); err != nil {
			return fmt.Errorf("apply nftables rules: %w", err)
		}
		killpoint.Here("nftables rules")
	}
	for i, h := range p.others {
		err := h.remove(ctx, p.elsewhere[i])
		release(h.fw)
		if err != nil {
			return err
		}
	}
	// A pod switched from EBPF mode: the rules are in place, so its
	// registration goes.
	if err := p.forgetEBPF(); err != nil {
		return err
	}
	return p.routing.Remove(p.Remove)
}

// allBackends are the backends meshwire's rules may be in.
var allBackends = []firewall.Backend{
	{Kind: firewall.IPTables, Variant: firewall.VariantLegacy},
	{Kind: firewall.IPTables, Variant: firewall.VariantNFT},
	{Kind: firewall.NFTables},
}

// iptablesTables are the iptables tables interception rules live in.
var iptablesTables = []string{intercept.Raw, intercept.Mangle, intercept.NAT}

// holding is what one backend holds of meshwire's interception rules in
// the namespace, read back once through its firewall.
type holding struct {
	b  firewall.Backend
	fw firewall.Interface
	Held
	// errs are the families that could not be read (no ip6tables, say).
	errs map[intercept.Family]error
}

func read(ctx context.Context, b firewall.Backend, fw firewall.Interface) *holding {
	h := &holding{b: b, fw: fw, errs: map[intercept.Family]error{},
		Held: Held{IPTables: map[intercept.Family][]*installed.Table{}, Nft: map[string]*installed.Table{}}}
	if b.Kind == firewall.NFTables {
		var names []string
		for _, nt := range intercept.NftTables {
			names = append(names, nt.Name)
		}
		tables, err := fw.ReadTables(ctx, ruleset.Inet, names)
		if err != nil {
			h.errs[intercept.V4] = fmt.Errorf("read inet tables %s: %w", strings.Join(names, ", "), err)
		}
		for _, t := range tables {
			h.Nft[t.Name] = t
		}
		for _, f := range bothFamilies {
			ok, err := fw.HasTable(ctx, f.Tables(), intercept.LegacyNftTable)
			if err != nil {
				h.errs[f] = fmt.Errorf("read %s table %s: %w", f.Tables().Name(), intercept.LegacyNftTable, err)
			}
			if ok {
				h.LegacyNft = append(h.LegacyNft, f)
			}
		}
		return h
	}
	for _, f := range bothFamilies {
		tables, err := fw.ReadTables(ctx, f.Tables(), iptablesTables)
		if err != nil {
			h.errs[f] = fmt.Errorf("read %s's %s tables: %w", b, f, err)
			continue
		}
		h.IPTables[f] = tables
	}
	return h
}

// WantIPv6 is the decision to program IPv6 rules, istio-iptables' own
// (getLocalIP in tools/common/config): the pod's first address that is
// neither loopback nor link-local decides, IPv6 rules for an IPv6 one;
// with dual stack (--dual-stack, ISTIO_DUAL_STACK), any IPv6 address among
// them. addrs are in the kernel's order (interface index, then address),
// as istio reads them. ::6 and the rest of ::/96, which meshwire itself
// puts on lo for the IPv6 passthrough, say nothing about the pod. A pod
// without such an address gets IPv4 rules (istio-iptables fails there).
func WantIPv6(dualStack bool, addrs []netip.Addr) bool {
	for _, a := range addrs {
		if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || compat96.Contains(a) {
			continue
		}
		if a.Is6() || !dualStack {
			return a.Is6()
		}
	}
	return false
}

var compat96 = netip.MustParsePrefix("::/96")

// LocalAddrs lists the addresses of the current namespace.
func LocalAddrs() ([]netip.Addr, error) {
	addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// toolsPresent reports whether the backend's tools are installed.
func toolsPresent(b firewall.Backend) bool {
	name := "nft"
	if b.Kind == firewall.IPTables {
		name = "iptables-save"
		if b.Variant != firewall.VariantDefault {
			name = "iptables-" + string(b.Variant) + "-save"
		}
	}
	_, err := exec.LookPath(name)
	return err == nil
}

// resolveVariant tells which variant a plain `iptables` backend is, as
// the firewall decides it (both families' tools nf_tables-backed: nft).
func resolveVariant(b firewall.Backend) firewall.Variant {
	if b.Kind != firewall.IPTables || b.Variant != firewall.VariantDefault {
		return b.Variant
	}
	if b.NFTablesBacked() {
		return firewall.VariantNFT
	}
	return firewall.VariantLegacy
}
