package apply

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwfake"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// Install behaviour on fwfake.Fake: what Prepare, Apply and Cleanup write,
// for each backend and both families, without root.

var (
	legacy   = firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantLegacy}
	iptNFT   = firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantNFT}
	nftables = firewall.Backend{Kind: firewall.NFTables}
)

// fakeRouting is policy routing in memory.
type fakeRouting struct{ have []intercept.Step }

func (r *fakeRouting) Apply(steps []intercept.Step) error {
	r.have = appendNew(r.have, steps...)
	return nil
}

func (r *fakeRouting) Remove(steps []intercept.Step) error {
	r.have = slices.DeleteFunc(r.have, func(s intercept.Step) bool { return slices.Contains(steps, s) })
	return nil
}

func (r *fakeRouting) OfMark(mark uint32) []intercept.Step {
	var out []intercept.Step
	for _, s := range r.have {
		if s.Kind == intercept.StepRule && s.Mark == mark {
			out = append(out, s, intercept.Step{Kind: intercept.StepLocalRoute, Family: s.Family, Table: s.Table})
		}
	}
	return out
}

func sameSteps(a, b []intercept.Step) bool {
	return len(a) == len(b) && !slices.ContainsFunc(a, func(s intercept.Step) bool { return !slices.Contains(b, s) })
}

// pod is a pod namespace: a Fake per backend installed, and its routing.
type pod struct {
	fakes   map[firewall.Backend]*fwfake.Fake
	routing *fakeRouting
}

func newPod(backends ...firewall.Backend) *pod {
	p := &pod{fakes: map[firewall.Backend]*fwfake.Fake{}, routing: &fakeRouting{}}
	for _, b := range backends {
		p.fakes[b] = fwfake.New(b)
	}
	return p
}

func (p *pod) open(b firewall.Backend) firewall.Interface {
	if f, ok := p.fakes[b]; ok {
		return f
	}
	return nil
}

func (p *pod) req(c intercept.Config, b firewall.Backend, ipv6 bool) Request {
	return Request{Config: c, IPv6: ipv6, Backend: b, Firewall: p.open, Routing: p.routing, ForgetEBPF: func() error { return nil }}
}

// writes lists every transaction applied, over all backends.
func (p *pod) writes() []string {
	var out []string
	for _, b := range allBackends {
		if f := p.fakes[b]; f != nil {
			for _, op := range f.Ops() {
				out = append(out, b.String()+": "+op)
			}
		}
	}
	return out
}

// rules is what a firewall holds, for comparisons: every user chain and
// every chain with rules, by family, table and chain, with the rules'
// typed fields (handles, which differ between runs, cleared).
func rules(fw *fwfake.Fake) map[string][]installed.Rule {
	out := map[string][]installed.Rule{}
	type named struct {
		fam  ruleset.Family
		name string
	}
	var tables []named
	if fw.Backend().Kind == firewall.IPTables {
		for _, fam := range []ruleset.Family{ruleset.IP, ruleset.IP6} {
			for _, n := range iptablesTables {
				tables = append(tables, named{fam, n})
			}
		}
	} else {
		for _, nt := range intercept.NftTables {
			tables = append(tables, named{ruleset.Inet, nt.Name})
		}
	}
	{
		for _, tn := range tables {
			fam, n := tn.fam, tn.name
			t := fw.Table(fam, n)
			if t == nil {
				continue
			}
			for _, c := range t.Chains {
				if c.Hook != "" && len(c.Rules) == 0 && fw.Backend().Kind == firewall.IPTables {
					continue
				}
				rs := slices.Clone(c.Rules)
				for i := range rs {
					rs[i].Handle = 0
				}
				out[fmt.Sprintf("%s %s %s", fam.Name(), n, c.Name)] = rs
			}
		}
	}
	return out
}

// fresh is what a fresh install of c holds on backend b.
func fresh(t *testing.T, c intercept.Config, b firewall.Backend, ipv6 bool) map[string][]installed.Rule {
	t.Helper()
	p := newPod(b)
	plan, err := Prepare(context.Background(), p.req(c, b, ipv6))
	if err != nil {
		t.Fatal(err)
	}
	if err := plan.Apply(context.Background()); err != nil {
		t.Fatal(err)
	}
	return rules(p.fakes[b])
}

func assertHolds(t *testing.T, p *pod, b firewall.Backend, want map[string][]installed.Rule, what string) {
	t.Helper()
	got := rules(p.fakes[b])
	if !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("%s: %s holds\n%s\nwant\n%s", what, b, dump(got), dump(want))
	}
}

func dump(m map[string][]installed.Rule) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "%s:\n", k)
		for _, r := range m[k] {
			fmt.Fprintf(&b, "\t%+v\n", r)
		}
	}
	return b.String()
}

func tproxy(mark uint32, table uint32) intercept.Config {
	c := intercept.Default()
	c.Mode = intercept.ModeTProxy
	c.TProxyMark, c.TProxyRouteTable = mark, table
	return c
}

// run prepares and applies, and returns the transactions written.
func run(t *testing.T, p *pod, req Request) (*Plan, []string) {
	t.Helper()
	before := len(p.writes())
	plan, err := Prepare(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if err := plan.Apply(context.Background()); err != nil {
		t.Fatal(err)
	}
	return plan, p.writes()[before:]
}

// TestInstallLifecycle: install; the same again changes nothing; other
// flags are refused, then replace the rules in one transaction per family
// (or one nft script); cleanup leaves nothing.
func TestInstallLifecycle(t *testing.T) {
	ctx := context.Background()
	for _, b := range allBackends {
		for _, ipv6 := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/ipv6=%v", b, ipv6), func(t *testing.T) {
				p := newPod(allBackends...)
				perChange := 1 // one nft script
				if b.Kind == firewall.IPTables && ipv6 {
					perChange = 2 // one iptables-restore per family
				}
				redirect, tp := intercept.Default(), tproxy(0x539, 133)

				plan, w := run(t, p, p.req(redirect, b, ipv6))
				if len(w) != perChange || plan.UpToDate() {
					t.Fatalf("install wrote %q (up to date: %v)", w, plan.UpToDate())
				}
				assertHolds(t, p, b, fresh(t, redirect, b, ipv6), "install")

				plan, w = run(t, p, p.req(redirect, b, ipv6))
				if len(w) != 0 || !plan.UpToDate() || !strings.Contains(plan.String(), "nothing to do") {
					t.Fatalf("re-run wrote %q (up to date: %v):\n%s", w, plan.UpToDate(), plan)
				}

				req := p.req(tp, b, ipv6)
				if _, err := Prepare(ctx, req); !errors.Is(err, ErrDifferent) {
					t.Fatalf("other flags without --reconcile: %v", err)
				}
				req.Reconcile = true
				if _, w = run(t, p, req); len(w) != perChange {
					t.Fatalf("reconcile to TPROXY wrote %q", w)
				}
				assertHolds(t, p, b, fresh(t, tp, b, ipv6), "reconciled to TPROXY")
				if want := intercept.Routing(tp, ipv6); !sameSteps(p.routing.have, want) {
					t.Fatalf("routing %v, want %v", p.routing.have, want)
				}

				req = p.req(redirect, b, ipv6)
				req.Reconcile = true
				if _, w = run(t, p, req); len(w) != perChange {
					t.Fatalf("reconcile back to REDIRECT wrote %q", w)
				}
				assertHolds(t, p, b, fresh(t, redirect, b, ipv6), "reconciled back to REDIRECT")
				if want := intercept.Routing(redirect, ipv6); !sameSteps(p.routing.have, want) {
					t.Fatalf("routing %v, want %v", p.routing.have, want)
				}

				// Installed with another mark and table, removed with
				// the default flags: the policy routing found goes too.
				req = p.req(tproxy(0x64, 200), b, ipv6)
				req.Reconcile = true
				run(t, p, req)
				before := len(p.writes())
				out, err := Cleanup(ctx, p.req(redirect, b, ipv6), true)
				if err != nil || len(p.writes()) != before || !strings.Contains(out, "# "+b.String()+"\n") ||
					!strings.Contains(out, "remove if present: ip -4 rule add fwmark 0x64 lookup 200") {
					t.Fatalf("dry-run cleanup (%v) wrote %q:\n%s", err, p.writes()[before:], out)
				}
				if _, err := Cleanup(ctx, p.req(redirect, b, ipv6), false); err != nil {
					t.Fatal(err)
				}
				if w := p.writes()[before:]; len(w) != perChange {
					t.Fatalf("cleanup wrote %q", w)
				}
				assertHolds(t, p, b, map[string][]installed.Rule{}, "cleanup")
				if len(p.routing.have) != 0 {
					t.Fatalf("routing left: %v", p.routing.have)
				}
				for _, o := range allBackends {
					if o != b && len(p.fakes[o].Ops()) != 0 {
						t.Fatalf("%s written: %q", o, p.fakes[o].Ops())
					}
				}
			})
		}
	}
}

// TestInstallForce: --force-apply rewrites the rules as they are, in one
// transaction per family, never doubled.
func TestInstallForce(t *testing.T) {
	for _, b := range allBackends {
		t.Run(b.String(), func(t *testing.T) {
			p := newPod(b)
			c := intercept.Default()
			run(t, p, p.req(c, b, true))
			req := p.req(c, b, true)
			req.Force = true
			plan, w := run(t, p, req)
			if plan.UpToDate() || len(w) == 0 {
				t.Fatalf("forced run wrote %q", w)
			}
			assertHolds(t, p, b, fresh(t, c, b, true), "forced")
		})
	}
}

// TestReconcileMovesBackend: rules installed with one backend are removed
// from it when another is asked for.
func TestReconcileMovesBackend(t *testing.T) {
	for _, from := range allBackends {
		for _, to := range allBackends {
			if from == to {
				continue
			}
			t.Run(from.String()+"-to-"+to.String(), func(t *testing.T) {
				p := newPod(allBackends...)
				c := intercept.Default()
				run(t, p, p.req(c, from, true))
				_, err := Prepare(context.Background(), p.req(c, to, true))
				if !errors.Is(err, ErrDifferent) || !strings.Contains(err.Error(), from.String()) {
					t.Fatalf("rules of %s not reported: %v", from, err)
				}
				req := p.req(c, to, true)
				req.Reconcile = true
				plan, _ := run(t, p, req)
				if !slices.Equal(plan.Others, []firewall.Backend{from}) {
					t.Fatalf("others: %v", plan.Others)
				}
				assertHolds(t, p, from, map[string][]installed.Rule{}, "left backend")
				assertHolds(t, p, to, fresh(t, c, to, true), "new backend")
			})
		}
	}
}

// TestForeignRulesKept: rules of others in the built-in chains, before and
// between meshwire's, survive reconciling and cleanup (removal by
// position counts them).
func TestForeignRulesKept(t *testing.T) {
	ctx := context.Background()
	nat := ruleset.TableID{Family: ruleset.IP, Name: intercept.NAT}
	proto := func(chain, p string) ruleset.Rule {
		return ruleset.Rule{Chain: chain, Match: []ruleset.Match{{Kind: ruleset.MatchProto, Name: p}}, Target: ruleset.Target{Kind: ruleset.Return}}
	}
	foreign := (&ruleset.Tx{}).InsertRule(nat, 0, proto("OUTPUT", "udp")).AddRule(nat, proto("OUTPUT", "icmp")).
		InsertRule(nat, 0, proto("PREROUTING", "udp"))
	for _, b := range []firewall.Backend{legacy, iptNFT} {
		t.Run(b.String(), func(t *testing.T) {
			p := newPod(b)
			c := intercept.Default()
			c.RedirectDNS, c.CaptureAllDNS = true, true
			run(t, p, p.req(c, b, false))
			if err := p.fakes[b].Apply(ctx, foreign); err != nil {
				t.Fatal(err)
			}
			req := p.req(tproxy(0x539, 133), b, false)
			req.Reconcile = true
			run(t, p, req)
			if _, err := Cleanup(ctx, p.req(c, b, false), false); err != nil {
				t.Fatal(err)
			}
			left := rules(p.fakes[b])
			want := []string{"ip nat OUTPUT", "ip nat PREROUTING"}
			if got := slices.Sorted(maps.Keys(left)); !slices.Equal(got, want) ||
				len(left["ip nat OUTPUT"]) != 2 || left["ip nat OUTPUT"][0].Proto != "udp" || left["ip nat OUTPUT"][1].Proto != "icmp" ||
				len(left["ip nat PREROUTING"]) != 1 {
				t.Fatalf("foreign rules after cleanup:\n%s", dump(left))
			}
		})
	}
}

// TestIstioRulesReplaced: a rule set istio-iptables left (untagged jumps)
// is different, and reconciling replaces it.
func TestIstioRulesReplaced(t *testing.T) {
	// What istio-iptables leaves: its chains, and untagged jumps.
	nat := ruleset.TableID{Family: ruleset.IP, Name: intercept.NAT}
	tcp := []ruleset.Match{{Kind: ruleset.MatchProto, Name: "tcp"}}
	jump := func(c string) ruleset.Target { return ruleset.Target{Kind: ruleset.Jump, Chain: c} }
	istio := (&ruleset.Tx{}).
		AddChain(nat, ruleset.Chain{Name: intercept.ChainInbound}).
		AddChain(nat, ruleset.Chain{Name: intercept.ChainOutput}).
		AddChain(nat, ruleset.Chain{Name: intercept.ChainRedirect}).
		AddRule(nat, ruleset.Rule{Chain: "PREROUTING", Match: tcp, Target: jump(intercept.ChainInbound)}).
		AddRule(nat, ruleset.Rule{Chain: "OUTPUT", Match: tcp, Target: jump(intercept.ChainOutput)}).
		AddRule(nat, ruleset.Rule{Chain: intercept.ChainOutput, Target: jump(intercept.ChainRedirect)}).
		AddRule(nat, ruleset.Rule{Chain: intercept.ChainRedirect, Match: tcp, Target: ruleset.Target{Kind: ruleset.Redirect, Port: 15001}})
	for _, b := range []firewall.Backend{legacy, iptNFT} {
		t.Run(b.String(), func(t *testing.T) {
			p := newPod(b)
			if err := p.fakes[b].Apply(context.Background(), istio); err != nil {
				t.Fatal(err)
			}
			c := intercept.Default()
			if _, err := Prepare(context.Background(), p.req(c, b, false)); !errors.Is(err, ErrDifferent) {
				t.Fatalf("istio's rules: %v", err)
			}
			req := p.req(c, b, false)
			req.Reconcile = true
			run(t, p, req)
			assertHolds(t, p, b, fresh(t, c, b, false), "replaced istio's")
		})
	}
}

// TestPlanString: the dry run names the tools of the backend and family.
func TestPlanString(t *testing.T) {
	p := newPod(iptNFT)
	c := intercept.Default()
	plan, err := Prepare(context.Background(), p.req(c, iptNFT, true))
	if err != nil {
		t.Fatal(err)
	}
	s := plan.String()
	for _, want := range []string{"# backend: iptables-nft\n", "# iptables-nft-restore --noflush\n*nat\n", "# ip6tables-nft-restore --noflush\n", "# remove if present: ip -4 rule add fwmark 0x539 lookup 133\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("dry run lacks %q:\n%s", want, s)
		}
	}
}

// counting counts a Fake's reads: what a real firewall does as netlink
// dumps, or for legacy iptables as one iptables-save per read.
type counting struct {
	*fwfake.Fake
	reads *int
}

func (c counting) ReadTable(ctx context.Context, fam ruleset.Family, table string) (*installed.Table, error) {
	*c.reads++
	return c.Fake.ReadTable(ctx, fam, table)
}

func (c counting) ReadTables(ctx context.Context, fam ruleset.Family, names []string) ([]*installed.Table, error) {
	*c.reads++
	return c.Fake.ReadTables(ctx, fam, names)
}

// TestReadsOncePerFamily: Prepare and Cleanup read each iptables backend
// once per family (for legacy iptables, one iptables-save each) and
// nftables once (istio's inet tables hold both families), Apply not at
// all.
func TestReadsOncePerFamily(t *testing.T) {
	ctx := context.Background()
	p := newPod(allBackends...)
	reads := 0
	req := p.req(tproxy(0x539, 133), iptNFT, true)
	req.Firewall = func(b firewall.Backend) firewall.Interface { return counting{p.fakes[b], &reads} }
	plan, err := Prepare(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	const perRun = 2 + 2 + 1
	if reads != perRun {
		t.Fatalf("Prepare read %d times", reads)
	}
	reads = 0
	if err := plan.Apply(ctx); err != nil || reads != 0 {
		t.Fatalf("Apply read %d times (%v)", reads, err)
	}
	if _, err := Cleanup(ctx, req, false); err != nil || reads != perRun {
		t.Fatalf("Cleanup read %d times (%v)", reads, err)
	}
}
