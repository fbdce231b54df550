// Package install applies meshwire's interception rule model (package
// intercept) to the network namespace the calling thread is in: it reads
// what is installed, plans the one transaction per family (or the one
// nftables transaction) that turns it into the desired rule set, and applies
// it together with the TPROXY policy routing (through netlink). Both the
// iptables-init command and the intercept CNI plugin use it.
package install

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/intercept"
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
	// Force (istio's --force-apply) writes the rule set even when it is
	// already installed as asked, and replaces other rules as Reconcile
	// does: each table is rewritten in one transaction, never doubled.
	Force bool
}

// Plan is what Apply will do; String shows it (dry run).
type Plan struct {
	Backend  firewall.Backend
	Families []intercept.Family
	Sets     map[intercept.Family]*intercept.RuleSet
	Status   map[intercept.Family]intercept.Status
	Restore  map[intercept.Family]string // iptables-restore payloads ("" when nothing to do)
	Nft      string                      // nftables script ("" when nothing to do)
	Add      []intercept.Step            // routing to ensure
	Remove   []intercept.Step            // routing to remove (a mode or family no longer used)
	// Others are the backends other than Backend that hold meshwire's
	// rules: reconciling removes them there.
	Others []firewall.Backend
	// Forced is set when the rules are rewritten whatever is installed.
	Forced bool
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

func families(ipv6 bool) []intercept.Family {
	if ipv6 {
		return []intercept.Family{intercept.V4, intercept.V6}
	}
	return []intercept.Family{intercept.V4}
}

// Prepare reads the installed state and plans the change. It fails with
// ErrDifferent (wrapped, with details) when other rules of meshwire's or
// istio-iptables' are there and req.Reconcile is false.
func Prepare(ctx context.Context, req Request) (*Plan, error) {
	b := req.Backend
	if b.Kind == "" {
		b = firewall.Detect(ctx)
	}
	b.Variant = resolveVariant(b)
	p := &Plan{
		Backend: b, Families: families(req.IPv6),
		Sets:    map[intercept.Family]*intercept.RuleSet{},
		Status:  map[intercept.Family]intercept.Status{},
		Restore: map[intercept.Family]string{},
		Forced:  req.Force,
	}
	// The family not in use gets an empty rule set: whatever was there
	// before (a dual-stack run) is a difference to remove.
	for _, f := range []intercept.Family{intercept.V4, intercept.V6} {
		if f == intercept.V6 && !req.IPv6 {
			p.Sets[f] = &intercept.RuleSet{Family: f}
		} else {
			p.Sets[f] = intercept.Build(req.Config, f)
		}
	}
	var nftSets []*intercept.RuleSet
	for _, f := range []intercept.Family{intercept.V4, intercept.V6} {
		want := p.Sets[f]
		switch b.Kind {
		case firewall.IPTables:
			st, err := iptablesState(ctx, b, f)
			if err != nil {
				if f == intercept.V6 && !req.IPv6 {
					continue // no ip6tables and no wish for it
				}
				return nil, err
			}
			p.Status[f] = intercept.Compare(want, st)
			if p.Status[f] != intercept.Current || req.Force && !want.Empty() {
				p.Restore[f] = intercept.Restore(want, st)
			}
		case firewall.NFTables:
			listing := nftListing(ctx, f)
			p.Status[f] = intercept.NftStatus(want, listing)
			if p.Status[f] != intercept.Current || req.Force && !want.Empty() {
				nftSets = append(nftSets, want)
			}
		default:
			return nil, fmt.Errorf("unknown firewall backend %q", b.Kind)
		}
	}
	if len(nftSets) > 0 {
		p.Nft = intercept.Nft(nftSets...)
	}
	for _, o := range allBackends() {
		if o == b {
			continue
		}
		if has, _ := holdsRules(ctx, o); has {
			p.Others = append(p.Others, o)
		}
	}
	p.Add = intercept.Routing(req.Config, req.IPv6)
	for _, s := range intercept.Routing(withMode(req.Config, intercept.ModeTProxy), true) {
		if !hasStep(p.Add, s) {
			p.Remove = append(p.Remove, s)
		}
	}
	var diff []string
	for _, f := range []intercept.Family{intercept.V4, intercept.V6} {
		if p.Status[f] == intercept.Different {
			diff = append(diff, fmt.Sprintf("%s (%s)", f, b))
		}
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

func hasStep(steps []intercept.Step, s intercept.Step) bool {
	for _, x := range steps {
		if x == s {
			return true
		}
	}
	return false
}

// String renders the plan as what would be run (the dry-run output).
func (p *Plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# backend: %s\n", p.Backend)
	for _, s := range p.Add {
		fmt.Fprintf(&b, "# %s\n", s)
	}
	for _, f := range []intercept.Family{intercept.V4, intercept.V6} {
		if p.Restore[f] != "" {
			tool := "iptables"
			if f == intercept.V6 {
				tool = "ip6tables"
			}
			if p.Backend.Variant != firewall.VariantDefault {
				tool += "-" + string(p.Backend.Variant)
			}
			fmt.Fprintf(&b, "# %s-restore --noflush\n%s", tool, p.Restore[f])
		}
	}
	if p.Nft != "" {
		fmt.Fprintf(&b, "# nft -f -\n%s", p.Nft)
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

// Apply makes the change: routing first (so that marked packets have
// somewhere to go the moment TPROXY rules exist), then the firewall
// transaction(s), then the removal of what the new rule set no longer
// needs.
func (p *Plan) Apply(ctx context.Context) error {
	if err := ApplySteps(p.Add); err != nil {
		return err
	}
	for _, f := range []intercept.Family{intercept.V4, intercept.V6} {
		if p.Restore[f] == "" {
			continue
		}
		if err := p.Backend.Restore(ctx, f, p.Restore[f]); err != nil {
			return fmt.Errorf("apply %s rules: %w", f, err)
		}
	}
	if p.Nft != "" {
		if err := firewall.NftApply(ctx, p.Nft); err != nil {
			return fmt.Errorf("apply nftables rules: %w", err)
		}
	}
	for _, o := range p.Others {
		if err := cleanBackend(ctx, o); err != nil {
			return err
		}
	}
	return RemoveSteps(p.Remove)
}

// Cleanup removes everything meshwire (or istio-iptables) installed for
// interception in every backend present, and the policy routing and
// passthrough address of cfg's mark and table. It returns what it removed,
// as the plan it ran (or, with dryRun, would run).
func Cleanup(ctx context.Context, cfg intercept.Config, dryRun bool) (string, error) {
	var out strings.Builder
	// The policy routing to remove: that of the given flags, and that of
	// any TPROXY mark the installed rules use (installed with other -t/-r).
	steps := intercept.Routing(withMode(cfg, intercept.ModeTProxy), true)
	for _, b := range allBackends() {
		for _, mark := range intercept.TProxyMarks(installedText(ctx, b)) {
			steps = appendNew(steps, routingOfMark(mark)...)
		}
	}
	for _, b := range allBackends() {
		script, err := cleanupScript(ctx, b)
		if err != nil {
			return out.String(), err
		}
		if script == "" {
			continue
		}
		fmt.Fprintf(&out, "# %s\n%s", b, script)
		if !dryRun {
			if err := cleanBackend(ctx, b); err != nil {
				return out.String(), err
			}
		}
	}
	for _, s := range steps {
		fmt.Fprintf(&out, "# remove if present: %s\n", s)
	}
	if !dryRun {
		if err := RemoveSteps(steps); err != nil {
			return out.String(), err
		}
	}
	return out.String(), nil
}

// allBackends lists the backends whose tools are installed.
func allBackends() []firewall.Backend {
	var out []firewall.Backend
	for _, b := range []firewall.Backend{
		{Kind: firewall.IPTables, Variant: firewall.VariantLegacy},
		{Kind: firewall.IPTables, Variant: firewall.VariantNFT},
		{Kind: firewall.NFTables},
	} {
		if toolsPresent(b) {
			out = append(out, b)
		}
	}
	return out
}

func cleanupScript(ctx context.Context, b firewall.Backend) (string, error) {
	var out strings.Builder
	if b.Kind == firewall.NFTables {
		var sets []*intercept.RuleSet
		for _, f := range []intercept.Family{intercept.V4, intercept.V6} {
			if nftListing(ctx, f) != "" {
				sets = append(sets, &intercept.RuleSet{Family: f})
			}
		}
		if len(sets) > 0 {
			out.WriteString(intercept.Nft(sets...))
		}
		return out.String(), nil
	}
	for _, f := range []intercept.Family{intercept.V4, intercept.V6} {
		st, err := iptablesState(ctx, b, f)
		if err != nil {
			continue
		}
		if !st.Empty() {
			out.WriteString(intercept.Restore(&intercept.RuleSet{Family: f}, st))
		}
	}
	return out.String(), nil
}

func cleanBackend(ctx context.Context, b firewall.Backend) error {
	if b.Kind == firewall.NFTables {
		script, _ := cleanupScript(ctx, b)
		if script == "" {
			return nil
		}
		if err := firewall.NftApply(ctx, script); err != nil {
			return fmt.Errorf("remove nftables rules: %w", err)
		}
		return nil
	}
	for _, f := range []intercept.Family{intercept.V4, intercept.V6} {
		st, err := iptablesState(ctx, b, f)
		if err != nil || st.Empty() {
			continue
		}
		if err := b.Restore(ctx, f, intercept.Restore(&intercept.RuleSet{Family: f}, st)); err != nil {
			return fmt.Errorf("remove %s rules from %s: %w", f, b, err)
		}
	}
	return nil
}

func holdsRules(ctx context.Context, b firewall.Backend) (bool, error) {
	s, err := cleanupScript(ctx, b)
	return s != "", err
}

func iptablesState(ctx context.Context, b firewall.Backend, f intercept.Family) (*intercept.State, error) {
	save, err := b.Save(ctx, f, "")
	if err != nil {
		return nil, err
	}
	return intercept.ParseSave(save), nil
}

func nftListing(ctx context.Context, f intercept.Family) string {
	out, err := firewall.Nft(ctx, "list", "table", intercept.NftFamily(f), intercept.NftTable)
	if err != nil {
		return ""
	}
	return out
}

// WantIPv6 is the decision to program IPv6 rules: asked for (--dual-stack)
// or the pod has a global IPv6 address.
func WantIPv6(dualStack bool, addrs []netip.Addr) bool {
	if dualStack {
		return true
	}
	for _, a := range addrs {
		// ::/96 holds the passthrough address ::6 meshwire itself puts on
		// lo; it says nothing about the pod's connectivity.
		if a.Is6() && !a.Is4In6() && a.IsGlobalUnicast() && !compat96.Contains(a) {
			return true
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

// installedText is everything a backend shows in the namespace (both
// families), for scanning.
func installedText(ctx context.Context, b firewall.Backend) string {
	var out strings.Builder
	for _, f := range []intercept.Family{intercept.V4, intercept.V6} {
		if b.Kind == firewall.NFTables {
			out.WriteString(nftListing(ctx, f))
		} else if save, err := b.Save(ctx, f, Mangle); err == nil {
			out.WriteString(save)
		}
	}
	return out.String()
}

// Mangle is the table TPROXY rules live in.
const Mangle = intercept.Mangle

// routingOfMark lists the policy rules of a mark (whatever their table)
// and the local default routes of those tables, for both families.
func routingOfMark(mark uint32) []intercept.Step {
	var steps []intercept.Step
	for _, f := range []intercept.Family{intercept.V4, intercept.V6} {
		rules, err := netlinksafe.RuleList(nlFamily(f))
		if err != nil {
			continue
		}
		for _, r := range rules {
			if r.Mark == mark && r.Table > 0 {
				steps = append(steps,
					intercept.Step{Kind: intercept.StepRule, Family: f, Mark: mark, Table: uint32(r.Table)},
					intercept.Step{Kind: intercept.StepLocalRoute, Family: f, Table: uint32(r.Table)})
			}
		}
	}
	return steps
}

func appendNew(steps []intercept.Step, more ...intercept.Step) []intercept.Step {
	for _, s := range more {
		if !hasStep(steps, s) {
			steps = append(steps, s)
		}
	}
	return steps
}
