//go:build kernel

package e2e

import (
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/test/harness"
)

// Objects named as meshwire named them before package attachment (its
// package doc lists the older forms) must still be checked, deleted and
// collected by the current binaries. The tests make the older form by hand
// from what the current ADD made, changing only the name (and the alias's
// network tag), which is all the older binaries did differently.

// bandwidthAge turns the pod's ifb into what an older meshwire made: the
// older name (attachment.LegacyIfb) and the older network tag in its alias
// (attachment.LegacyBandwidthNetworkTag). It returns the older name.
func bandwidthAge(t *testing.T, network string, p *bandwidthPod) string {
	t.Helper()
	id := attachment.ID{Network: network, ContainerID: p.att.RT.ContainerID, IfName: "eth0"}
	cur := bandwidthIfbOf(t, p.host)
	if cur != id.Ifb() {
		t.Fatalf("%s redirects to %q, want the current name %s", p.host, cur, id.Ifb())
	}
	old := attachment.LegacyIfb(network, id.ContainerID, id.IfName)
	l, err := netlink.LinkByName(cur)
	if err != nil {
		t.Fatal(err)
	}
	alias := strings.Replace(l.Attrs().Alias, " net="+attachment.NetworkTag(network)+" ", " net="+attachment.LegacyBandwidthNetworkTag(network)+" ", 1)
	if alias == l.Attrs().Alias {
		t.Fatalf("alias %q holds no net=%s", alias, attachment.NetworkTag(network))
	}
	for _, step := range []func() error{
		func() error { return netlink.LinkSetDown(l) },
		func() error { return netlink.LinkSetName(l, old) },
		func() error { return netlink.LinkSetAlias(l, alias) },
		func() error { return netlink.LinkSetUp(l) },
	} {
		if err := step(); err != nil {
			t.Fatalf("rename %s to %s: %v", cur, old, err)
		}
	}
	if got := bandwidthIfbOf(t, p.host); got != old {
		t.Fatalf("after the rename %s redirects to %q, want %s", p.host, got, old)
	}
	return old
}

// TestBandwidthOlderNames: an ifb with the older name and alias passes
// CHECK, is removed (with its redirect) by DEL, and by GC when its
// attachment is stale, and kept by GC while valid.
func TestBandwidthOlderNames(t *testing.T) {
	h := bandwidthHarness(t, bandwidthRefPtp)
	h.CheckNoLeaks()
	n := newBandwidthNet(t, h, bandwidthRefPtp, "1.0.0", "bw-older", "198.18.39.0/24", `{"type":"bandwidth"}`)
	shaping := map[string]any{"egressRate": 10000000, "egressBurst": 100000}
	var pods []*bandwidthPod
	older := map[*bandwidthPod]string{}
	for range 3 {
		p := n.pod(t, false, nil)
		if _, err := bandwidthExec(t, h, "ADD", p, bandwidthConf(n.name, "1.0.0", shaping)); err != nil {
			t.Fatalf("ADD: %v", err)
		}
		older[p] = bandwidthAge(t, n.name, p)
		pods = append(pods, p)
	}
	deleted, valid, stale := pods[0], pods[1], pods[2]

	if _, err := bandwidthExec(t, h, "CHECK", deleted, bandwidthConf(n.name, "1.0.0", shaping)); err != nil {
		t.Fatalf("CHECK of an ifb with the older name: %v", err)
	}

	if _, err := bandwidthExec(t, h, "DEL", deleted, bandwidthConf(n.name, "1.0.0", shaping)); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if _, ok := bandwidthIfbs(t)[older[deleted]]; ok {
		t.Fatalf("DEL left the ifb with the older name %s", older[deleted])
	}
	if got := bandwidthIfbOf(t, deleted.host); got != "" {
		t.Fatalf("DEL left the redirect from %s to %q", deleted.host, got)
	}

	gcConf := bandwidthConf(n.name, "1.1.0", map[string]any{
		"cni.dev/valid-attachments": []map[string]string{{"containerID": valid.att.RT.ContainerID, "ifname": "eth0"}}})
	if _, err := bandwidthExec(t, h, "GC", nil, gcConf); err != nil {
		t.Fatalf("GC: %v", err)
	}
	have := bandwidthIfbs(t)
	if _, ok := have[older[valid]]; !ok {
		t.Fatalf("GC removed %s, the ifb (older name) of a valid attachment (all: %v)", older[valid], have)
	}
	if _, ok := have[older[stale]]; ok {
		t.Fatalf("GC left %s, the ifb (older name) of a stale attachment", older[stale])
	}
	if got := bandwidthIfbOf(t, stale.host); got != "" {
		t.Fatalf("GC left the redirect from %s to %q", stale.host, got)
	}

	if _, err := bandwidthExec(t, h, "DEL", valid, bandwidthConf(n.name, "1.0.0", nil)); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if _, ok := bandwidthIfbs(t)[older[valid]]; ok {
		t.Fatalf("DEL (config without limits) left %s", older[valid])
	}
}

// portmapAge renames the attachment's chains to the older key
// (attachment.LegacyPortmapKey), as an older meshwire made them: jumps
// follow a renamed chain, and nothing else in them held the key.
func portmapAge(t *testing.T, backend string, a *harness.Attachment) {
	t.Helper()
	cur, old := portmapKey(a), portmapOlderKey(a)
	if old != attachment.LegacyPortmapKey(a.RT.ContainerID, a.RT.IfName) {
		t.Fatalf("older key %s, attachment.LegacyPortmapKey says %s", old, attachment.LegacyPortmapKey(a.RT.ContainerID, a.RT.IfName))
	}
	var cmds [][]string
	switch backend {
	case "nftables":
		cmds = [][]string{{"nft", "rename", "chain", "inet", "meshwire_portmap", "pm-" + cur, "pm-" + old}}
	case "iptables", "iptables-legacy":
		suffix := strings.TrimPrefix(backend, "iptables")
		for _, tool := range []string{"iptables" + suffix, "ip6tables" + suffix} {
			cmds = append(cmds, []string{tool, "-w", "-t", "nat", "-E", "MWHP-" + cur, "MWHP-" + old})
		}
	default:
		t.Fatalf("backend %q", backend)
	}
	for _, c := range cmds {
		if out, err := harness.Run(c[0], c[1:]...); err != nil {
			t.Fatalf("%v: %v: %s", c, err, out)
		}
	}
	if rules := portmapRules(t); strings.Contains(rules, cur) || !strings.Contains(rules, old) {
		t.Fatalf("after renaming %s to %s:\n%s", cur, old, rules)
	}
}

// TestPortmapOlderKeys: chains keyed as an older meshwire keyed them still
// map their ports, pass CHECK, are removed by DEL, and by GC when stale,
// and kept by GC while valid, with every backend.
func TestPortmapOlderKeys(t *testing.T) {
	for i, backend := range []string{"iptables", "nftables", "iptables-legacy"} {
		t.Run(backend, func(t *testing.T) {
			e := newPortmapEnv(t)
			list := e.list("1.1.0", "mwtp-older-"+backend, pmKeys(backend))
			port := 30500 + 10*i
			deleted := e.pod(t, list, pmPort{port, 80, "tcp", ""})
			valid := e.pod(t, list, pmPort{port + 1, 80, "tcp", ""})
			stale := e.pod(t, list, pmPort{port + 2, 80, "tcp", ""})
			for _, p := range []*pmPod{deleted, valid, stale} {
				portmapAge(t, backend, p.att)
			}
			got, err := portmapTCP(e.outside, pmHost4, port)
			portmapMustReach(t, "chain with the older key", got, err, pmClient4)

			if err := deleted.att.Check(); err != nil {
				t.Fatalf("CHECK of chains with the older key: %v", err)
			}
			if err := deleted.att.Del(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if rules := portmapRules(t); strings.Contains(rules, portmapOlderKey(deleted.att)) {
				t.Fatalf("DEL left the chains with the older key %s:\n%s", portmapOlderKey(deleted.att), rules)
			}
			got, err = portmapTCP(e.outside, pmHost4, port)
			portmapMustNotReach(t, "deleted attachment", got, err)

			if err := e.h.GC(list, valid.att.GCAttachment()); err != nil {
				t.Fatalf("GC: %v", err)
			}
			rules := portmapRules(t)
			if strings.Contains(rules, portmapOlderKey(stale.att)) {
				t.Fatalf("GC left the stale attachment's chains (older key %s):\n%s", portmapOlderKey(stale.att), rules)
			}
			if !strings.Contains(rules, portmapOlderKey(valid.att)) {
				t.Fatalf("GC removed the valid attachment's chains (older key %s):\n%s", portmapOlderKey(valid.att), rules)
			}
			got, err = portmapTCP(e.outside, pmHost4, port+1)
			portmapMustReach(t, "valid attachment after GC", got, err, pmClient4)

			if err := valid.att.Del(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			portmapAssertClean(t, "after DEL of every attachment", deleted.att, valid.att, stale.att)
		})
	}
}
