// Package apply applies meshwire's interception rule model (package
// intercept) to the network namespace the calling thread is in: it reads
// what is installed as typed rules through the firewall front door
// (firewall.Interface: netlink for nf_tables, legacy iptables' text only
// for the tables the namespace loaded), plans the one transaction per
// family (or the one nftables transaction) that turns it into the desired
// rule set, and applies it together with the TPROXY policy routing
// (through netlink). Both the iptables-init command and the intercept CNI
// plugin use it; tests give it fwfake.Fakes (Request.Firewall).
package apply

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/killpoint"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// ErrDifferent is returned by Prepare when other interception rules are
// installed and reconciling was not asked for.
var ErrDifferent = errors.New("interception rules with other settings are already installed")

// Request is what to install.
type Request struct {
	Config intercept.Config
	IPv6   bool
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

// Plan is what Apply will do; String shows it (dry run): the operations
// intercept.Plan gives, and the firewall to apply them to.
type Plan struct {
	Backend firewall.Backend
	intercept.Ops
	// Others are the backends other than Backend that hold meshwire's
	// rules: reconciling removes them there.
	Others []firewall.Backend
	// Forced is set when the rules are rewritten whatever is installed.
	Forced bool

	fw         firewall.Interface
	others     []*holding
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

// Prepare reads the installed state and plans the change (intercept.Plan).
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
	for _, o := range allBackends {
		if o == b {
			continue
		}
		fw := req.open(o, false)
		if fw == nil {
			continue
		}
		if h := read(ctx, o, fw); !h.empty() {
			p.Others = append(p.Others, o)
			p.others = append(p.others, h)
		}
		release(fw)
	}
	p.Ops = intercept.Plan(&have.Held, intercept.Want{Config: req.Config, IPv6: req.IPv6, NFTables: b.Kind == firewall.NFTables, Force: req.Force})
	var diff []string
	for _, f := range p.Different() {
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

func withMode(c intercept.Config, m intercept.Mode) intercept.Config {
	c.Mode = m
	return c
}

// release ends a firewall's use; a socket whose close waits for the
// kernel to free what was removed is closed here (a pod's interception
// rules are few).
func release(fw firewall.Interface) {
	if f := fw.Release(); f != nil {
		_ = f.Close()
	}
}

// String renders the plan as what would be run (the dry-run output).
func (p *Plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# backend: %s\n", p.Backend)
	for _, s := range p.Add {
		fmt.Fprintf(&b, "# %s\n", s)
	}
	for _, f := range bothFamilies {
		if !p.Restore[f].Empty() {
			fmt.Fprintf(&b, "# %s --noflush\n%s", restoreTool(p.Backend, f), text(p.Backend, p.Restore[f]))
		}
	}
	if !p.Nft.Empty() {
		fmt.Fprintf(&b, "# nft -f -\n%s", text(p.Backend, p.Nft))
	}
	for _, s := range p.Remove {
		fmt.Fprintf(&b, "# remove if present: %s\n", s)
	}
	for _, o := range p.Others {
		fmt.Fprintf(&b, "# remove meshwire's rules from %s\n", o)
	}
	if p.UpToDate() {
		b.WriteString("# rules already installed as asked: nothing to do\n")
	}
	return b.String()
}

// text renders a transaction as the tool of b would get it (the dry
// run's output).
func text(b firewall.Backend, tx *ruleset.Tx) string {
	return fwtext.Text(tx, b.Kind == firewall.NFTables)
}

// restoreTool names the iptables-restore of a backend and family.
func restoreTool(b firewall.Backend, f intercept.Family) string {
	tool := "iptables"
	if f == intercept.V6 {
		tool = "ip6tables"
	}
	if b.Variant != firewall.VariantDefault {
		tool += "-" + string(b.Variant)
	}
	return tool + "-restore"
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
	for _, h := range p.others {
		err := h.remove(ctx)
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

// Cleanup removes everything meshwire (or istio-iptables) installed for
// interception in every backend present, and the policy routing and
// passthrough address of req.Config's mark and table. It returns what it
// removed, as the plan it ran (or, with dryRun, would run). Of req, only
// Config, Firewall and Routing count.
func Cleanup(ctx context.Context, req Request, dryRun bool) (string, error) {
	var out strings.Builder
	routing := req.routing()
	// The policy routing to remove: that of the given flags, and that of
	// any TPROXY mark the installed rules use (installed with other -t/-r).
	steps := intercept.Routing(withMode(req.Config, intercept.ModeTProxy), true)
	var held []*holding
	for _, b := range allBackends {
		fw := req.open(b, false)
		if fw == nil {
			continue
		}
		defer release(fw)
		h := read(ctx, b, fw)
		for _, mark := range h.Marks() {
			steps = appendNew(steps, routing.OfMark(mark)...)
		}
		held = append(held, h)
	}
	for _, h := range held {
		script := h.script()
		if script == "" {
			continue
		}
		fmt.Fprintf(&out, "# %s\n%s", h.b, script)
		if !dryRun {
			if err := h.remove(ctx); err != nil {
				return out.String(), err
			}
		}
	}
	for _, s := range steps {
		fmt.Fprintf(&out, "# remove if present: %s\n", s)
	}
	out.WriteString("# remove if present: the pod's ebpf interception registration and inbound filters\n")
	if !dryRun {
		if err := routing.Remove(steps); err != nil {
			return out.String(), err
		}
		if err := req.forgetEBPF(); err != nil {
			return out.String(), err
		}
	}
	return out.String(), nil
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
	intercept.Held
	// errs are the families that could not be read (no ip6tables, say).
	errs map[intercept.Family]error
}

func read(ctx context.Context, b firewall.Backend, fw firewall.Interface) *holding {
	h := &holding{b: b, fw: fw, errs: map[intercept.Family]error{},
		Held: intercept.Held{IPTables: map[intercept.Family][]*installed.Table{}, Nft: map[string]*installed.Table{}}}
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

// empty reports whether nothing of meshwire's was found.
func (h *holding) empty() bool { return h.script() == "" }

// script is the removal as text (dry runs), "" when there is nothing.
func (h *holding) script() string {
	var b strings.Builder
	for _, tx := range h.Removal() {
		b.WriteString(text(h.b, tx))
	}
	return b.String()
}

// remove removes what was found, one transaction per family (iptables)
// or one in all (nftables).
func (h *holding) remove(ctx context.Context) error {
	for _, tx := range h.Removal() {
		if err := h.fw.Apply(ctx, tx); err != nil {
			return fmt.Errorf("remove meshwire's rules from %s: %w", h.b, err)
		}
	}
	return nil
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

func appendNew(steps []intercept.Step, more ...intercept.Step) []intercept.Step {
	for _, s := range more {
		if !slices.Contains(steps, s) {
			steps = append(steps, s)
		}
	}
	return steps
}
