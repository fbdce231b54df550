package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwfake"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// ADD, DEL, CHECK and GC against the firewall's in-memory Fake, for every
// backend: what lands in the tables, what is left after each step, and
// which transactions ran. No root needed; the e2e tests do the same on a
// real kernel with traffic.

var fakeBackends = []firewall.Backend{
	{Kind: firewall.IPTables, Variant: firewall.VariantLegacy},
	{Kind: firewall.IPTables, Variant: firewall.VariantNFT},
	{Kind: firewall.NFTables},
}

// fakeNode is one node's firewall and portmap state directory.
type fakeNode struct {
	t   *testing.T
	ctx context.Context
	b   firewall.Backend
	fw  *fwfake.Fake
	d   driver
}

func newFakeNode(t *testing.T, b firewall.Backend) *fakeNode {
	t.Helper()
	old := stateDir
	stateDir = t.TempDir()
	t.Cleanup(func() { stateDir = old })
	fw := fwfake.New(b)
	return &fakeNode{t: t, ctx: context.Background(), b: b, fw: fw, d: newDriver(fw)}
}

func (n *fakeNode) iptables() bool { return n.b.Kind == firewall.IPTables }

// pod is an attachment of network with a dual-stack address.
func pod(network, id string) attachment.ID {
	return attachment.ID{Network: network, ContainerID: id, IfName: "eth0"}
}

var (
	podV4 = &net.IPNet{IP: net.ParseIP("198.18.48.5").To4(), Mask: net.CIDRMask(24, 32)}
	podV6 = &net.IPNet{IP: net.ParseIP("fd50:48::5"), Mask: net.CIDRMask(64, 128)}
)

// plans are the plans of a with the given portMappings entries (JSON).
func (n *fakeNode) plans(a attachment.ID, mappings string) []famPlan {
	n.t.Helper()
	c, err := parseConfig([]byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"portmap","backend":%q,"runtimeConfig":{"portMappings":[%s]}}`,
		a.Network, n.b.String(), mappings)))
	if err != nil {
		n.t.Fatal(err)
	}
	return plan(c, a, podV4, podV6)
}

const (
	tcpUDP  = `{"hostPort":30080,"containerPort":80,"protocol":"tcp"},{"hostPort":30081,"containerPort":81,"protocol":"udp"}`
	tcpOnly = `{"hostPort":30090,"containerPort":80,"protocol":"tcp"}`
)

func (n *fakeNode) add(a attachment.ID, mappings string) []famPlan {
	n.t.Helper()
	plans := n.plans(a, mappings)
	if err := n.d.add(n.ctx, a, plans); err != nil {
		n.t.Fatalf("ADD %s: %v", a.ContainerID, err)
	}
	return plans
}

func (n *fakeNode) del(a attachment.ID, wantUDP bool) map[ruleset.IPVersion][]int {
	n.t.Helper()
	udp, err := n.d.del(n.ctx, a.PortmapKeys(), []ruleset.IPVersion{ruleset.V4, ruleset.V6}, wantUDP)
	if err != nil {
		n.t.Fatalf("DEL %s: %v", a.ContainerID, err)
	}
	return udp
}

func (n *fakeNode) mustCheck(a attachment.ID, plans []famPlan) {
	n.t.Helper()
	if err := n.d.check(n.ctx, a, plans); err != nil {
		n.t.Fatalf("CHECK %s: %v", a.ContainerID, err)
	}
}

// tables are the tables portmap owns or shares on the node.
func (n *fakeNode) tables() []*installed.Table {
	if n.iptables() {
		return []*installed.Table{n.fw.Table(ruleset.IP, "nat"), n.fw.Table(ruleset.IP6, "nat")}
	}
	return []*installed.Table{n.fw.Table(ruleset.Inet, nftTable)}
}

func (n *fakeNode) prefix() string {
	if n.iptables() {
		return iptPrefix
	}
	return nftPrefix
}

// keys lists the attachment keys in the tables (per table, joined).
func (n *fakeNode) keys() string {
	var out []string
	for _, t := range n.tables() {
		out = append(out, strings.Join(attachmentKeys(t, n.prefix()), ","))
	}
	return strings.Join(out, " | ")
}

func (n *fakeNode) wantKeys(what string, as ...attachment.ID) {
	n.t.Helper()
	var ks []string
	for _, a := range as {
		ks = append(ks, a.PortmapKey())
	}
	slices.Sort(ks)
	want := strings.Join(ks, ",")
	if n.iptables() {
		want += " | " + want
	}
	if got := n.keys(); got != want {
		n.t.Fatalf("%s: attachments %q, want %q\n%s", what, got, want, n.fw.Dump())
	}
}

// baseLeft reports whether any piece of portmap's base is on the node.
func (n *fakeNode) baseLeft() bool {
	for _, t := range n.tables() {
		if !n.iptables() {
			if t != nil {
				return true
			}
			continue
		}
		if iptHasBase(t) || len(jumps(t, "PREROUTING", iptTop))+len(jumps(t, "OUTPUT", iptTop))+len(jumps(t, "POSTROUTING", iptMasq)) > 0 {
			return true
		}
	}
	return false
}

func (n *fakeNode) hints() []string {
	m, _ := filepath.Glob(filepath.Join(stateDir, "*.base"))
	return m
}

// flush empties a's attachment chain behind portmap's back.
func (n *fakeNode) flush(a attachment.ID) {
	n.t.Helper()
	var err error
	if n.iptables() {
		for _, f := range []ruleset.IPVersion{ruleset.V4, ruleset.V6} {
			if err = n.fw.Apply(n.ctx, (&ruleset.Tx{}).FlushChain(iptNat(f), iptAttChain(a.PortmapKey()))); err != nil {
				break
			}
		}
	} else {
		err = n.fw.Apply(n.ctx, (&ruleset.Tx{}).FlushChain(nftID, nftAttChain(a.PortmapKey())))
	}
	if err != nil {
		n.t.Fatal(err)
	}
}

func TestFakeAddCheckDel(t *testing.T) {
	for _, b := range fakeBackends {
		t.Run(b.String(), func(t *testing.T) {
			n := newFakeNode(t, b)
			a1, a2 := pod("n1", "c1"), pod("n1", "c2")
			perADD := 1 // transactions of one ADD on the fast path
			if n.iptables() {
				perADD = 2 // one per family
			}

			p1 := n.add(a1, tcpUDP)
			if got := len(n.fw.Ops()); got != perADD {
				t.Fatalf("first ADD: %d transactions %v, want %d (base and attachment together)", got, n.fw.Ops(), perADD)
			}
			n.wantKeys("after ADD", a1)
			n.mustCheck(a1, p1)
			if len(n.hints()) == 0 {
				t.Fatal("no base hint after the first ADD")
			}

			p2 := n.add(a2, tcpOnly)
			if got := len(n.fw.Ops()); got != 2*perADD {
				t.Fatalf("second ADD: %d transactions in all %v, want %d", got, n.fw.Ops(), 2*perADD)
			}
			n.wantKeys("after the second ADD", a1, a2)
			n.mustCheck(a2, p2)

			// A repeated ADD goes the slow way and leaves one copy.
			n.add(a1, tcpUDP)
			n.mustCheck(a1, p1)
			n.wantKeys("after a repeated ADD", a1, a2)

			// CHECK against other mappings, then against flushed rules.
			err := n.d.check(n.ctx, a1, n.plans(a1, `{"hostPort":30701,"containerPort":80,"protocol":"tcp"}`))
			if err == nil || !strings.Contains(err.Error(), "30701") {
				t.Fatalf("CHECK with other mappings: %v, want a mismatch naming 30701", err)
			}
			n.flush(a1)
			if err := n.d.check(n.ctx, a1, p1); err == nil {
				t.Fatal("CHECK passed with the attachment's rules flushed")
			}
			n.add(a1, tcpUDP) // repaired by a repeated ADD
			n.mustCheck(a1, p1)

			// DEL without mappings reports the UDP ports its rules had.
			udp := n.del(a1, true)
			if fmt.Sprint(udp[ruleset.V4], udp[ruleset.V6]) != "[30081] [30081]" {
				t.Fatalf("UDP ports of the deleted rules: %v", udp)
			}
			n.wantKeys("after DEL", a2)
			n.mustCheck(a2, p2)
			if !n.baseLeft() {
				t.Fatal("the base went while an attachment is left")
			}
			ops := len(n.fw.Ops())
			var tried []string
			n.fw.Fail = func(route string) error { tried = append(tried, route); return nil }
			n.del(a1, true)
			n.fw.Fail = nil
			if got := n.fw.Ops(); len(got) != ops {
				t.Fatalf("a second DEL changed the firewall: %v", got[ops:])
			}
			// containerd repeats every DEL: with iptables, one of an
			// attachment already gone tries no transaction (on legacy
			// iptables each would copy the whole nat table).
			if n.iptables() && len(tried) > 0 {
				t.Fatalf("a second DEL tried transactions %v, want none", tried)
			}

			n.del(a2, false)
			n.wantKeys("after the last DEL")
			if n.baseLeft() {
				t.Fatalf("the base outlived the last attachment:\n%s", n.fw.Dump())
			}
			if h := n.hints(); len(h) > 0 {
				t.Fatalf("base hints outlived the base: %v", h)
			}
			n.del(a2, false) // DEL on a node without any table
		})
	}
}

func TestFakeGC(t *testing.T) {
	for _, b := range fakeBackends {
		t.Run(b.String(), func(t *testing.T) {
			n := newFakeNode(t, b)
			valid, stale1, stale2, other := pod("net-a", "v"), pod("net-a", "s1"), pod("net-a", "s2"), pod("net-b", "o")
			for _, a := range []attachment.ID{valid, stale1, stale2, other} {
				n.add(a, tcpOnly)
			}
			keep := map[string]bool{}
			for _, k := range valid.PortmapKeys() {
				keep[k] = true
			}
			if err := n.d.gc(n.ctx, "net-a", keep); err != nil {
				t.Fatal(err)
			}
			n.wantKeys("after GC of net-a", valid, other)
			ops := len(n.fw.Ops())
			if err := n.d.gc(n.ctx, "net-a", keep); err != nil || len(n.fw.Ops()) != ops {
				t.Fatalf("a GC with nothing stale: %v, transactions %v", err, n.fw.Ops()[ops:])
			}
			for _, network := range []string{"net-a", "net-b"} {
				if err := n.d.gc(n.ctx, network, nil); err != nil {
					t.Fatal(err)
				}
			}
			n.wantKeys("after GC of everything")
			if n.baseLeft() {
				t.Fatalf("the base outlived GC of every attachment:\n%s", n.fw.Dump())
			}
		})
	}
}

// TestFakeOlderKey: chains an earlier meshwire made under the older key
// are checked, kept by GC while valid, and removed by DEL.
func TestFakeOlderKey(t *testing.T) {
	for _, b := range fakeBackends {
		t.Run(b.String(), func(t *testing.T) {
			n := newFakeNode(t, b)
			a := pod("n1", "c-old")
			older := a.PortmapKeys()[1]
			plans := n.plans(a, tcpUDP)
			for i := range plans {
				plans[i].Key = older
			}
			if err := n.d.add(n.ctx, a, plans); err != nil {
				t.Fatal(err)
			}
			if got := n.keys(); !strings.Contains(got, older) {
				t.Fatalf("no chain under the older key: %s", got)
			}
			n.mustCheck(a, plans)
			keep := map[string]bool{}
			for _, k := range a.PortmapKeys() {
				keep[k] = true
			}
			if err := n.d.gc(n.ctx, "n1", keep); err != nil || !strings.Contains(n.keys(), older) {
				t.Fatalf("GC with the attachment valid: %v, left %s", err, n.keys())
			}
			if udp := n.del(a, true); len(udp[ruleset.V4]) != 1 {
				t.Fatalf("UDP ports of the older chain: %v", udp)
			}
			n.wantKeys("after DEL")
			if n.baseLeft() {
				t.Fatalf("the base outlived the last attachment:\n%s", n.fw.Dump())
			}
		})
	}
}

// TestFakeForeignRules: another owner's rule in a chain portmap hooks into
// survives ADD, GC and the teardown of the base.
func TestFakeForeignRules(t *testing.T) {
	for _, b := range fakeBackends[:2] {
		t.Run(b.String(), func(t *testing.T) {
			n := newFakeNode(t, b)
			foreign := ruleset.Rule{Chain: "PREROUTING", Match: []ruleset.Match{{Kind: ruleset.MatchDPort, Name: "tcp", Ports: []uint16{30999}}},
				Comment: "mwtp-foreign", Target: ruleset.Target{Kind: ruleset.Return}}
			if err := n.fw.Apply(n.ctx, (&ruleset.Tx{}).AddRule(iptNat(ruleset.V4), foreign)); err != nil {
				t.Fatal(err)
			}
			a := pod("n1", "c1")
			n.add(a, tcpOnly)
			if err := n.d.gc(n.ctx, "n1", nil); err != nil {
				t.Fatal(err)
			}
			n.del(a, false)
			if n.baseLeft() {
				t.Fatalf("the base is left:\n%s", n.fw.Dump())
			}
			pre := rulesOf(n.fw.Table(ruleset.IP, "nat"), "PREROUTING")
			if len(pre) != 1 || pre[0].Comment != "mwtp-foreign" {
				t.Fatalf("PREROUTING is %+v, want the foreign rule alone", pre)
			}
		})
	}
}

// TestFakeTeardownRace: the next pod's ADD lands between the last DEL's
// read and its teardown transaction; the kernel refuses the teardown, so
// the new pod's mapping stays whole.
func TestFakeTeardownRace(t *testing.T) {
	for _, b := range fakeBackends {
		t.Run(b.String(), func(t *testing.T) {
			n := newFakeNode(t, b)
			old, next := pod("n1", "old"), pod("n1", "next")
			n.add(old, tcpOnly)
			nextPlans := n.plans(next, `{"hostPort":30091,"containerPort":80,"protocol":"tcp"}`)
			// The teardown is the DEL's second transaction with iptables
			// (after the one that removes the attachment), its first with
			// nftables (attachment and table together).
			armed, seen := true, 0
			at := 2
			if !n.iptables() {
				at = 1
			}
			n.fw.Fail = func(op string) error {
				if !armed {
					return nil
				}
				if seen++; seen == at {
					armed = false
					if err := n.d.add(n.ctx, next, nextPlans); err != nil {
						t.Errorf("the racing ADD: %v", err)
					}
				}
				return nil
			}
			if _, err := n.d.del(n.ctx, old.PortmapKeys(), []ruleset.IPVersion{ruleset.V4}, false); err != nil {
				t.Fatal(err)
			}
			if armed {
				t.Fatalf("the ADD did not race the teardown (transactions %v)", n.fw.Ops())
			}
			n.fw.Fail = nil
			// IPv6 of the old pod was not part of this DEL.
			if n.iptables() {
				n.del(old, false)
			}
			n.wantKeys("after the raced DEL", next)
			n.mustCheck(next, nextPlans)
		})
	}
}

// TestFakeTryAgain: a busy firewall (the xtables lock) is CNI code 11,
// and the failed ADD changes nothing.
func TestFakeTryAgain(t *testing.T) {
	for _, b := range fakeBackends {
		t.Run(b.String(), func(t *testing.T) {
			n := newFakeNode(t, b)
			n.fw.Fail = func(string) error { return cnierr.TryAgain("the xtables lock is busy") }
			a := pod("n1", "c1")
			err := n.d.add(n.ctx, a, n.plans(a, tcpOnly))
			if cnierr.Code(err) != cnierr.CodeTryAgainLater {
				t.Fatalf("ADD on a busy firewall: %v, want code 11", err)
			}
			if len(n.fw.Ops()) != 0 || n.baseLeft() {
				t.Fatalf("a refused ADD changed the firewall: %v", n.fw.Ops())
			}
			if _, err := os.Stat(filepath.Join(stateDir, "lock")); err == nil {
				t.Fatal("a fast-path ADD took the node lock")
			}
		})
	}
}
