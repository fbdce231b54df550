package ambient

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/ruleset"
)

// The host rule, once per node: the node's own TCP connections to an
// enrolled pod (kubelet's probes) leave with the probe address as their
// source, which the pod's rules let through uncaptured. The enrolled
// pods' addresses are in the probe sets, which the node agent fills.

// ProbeSetName is the probe set of family f: istio-inpod-probes-v4, -v6.
func ProbeSetName(f ruleset.IPVersion) string {
	return fmt.Sprintf("%s-v%d", ProbeSet, int(f))
}

func snat(a netip.Addr) ruleset.Target {
	return ruleset.Target{Kind: ruleset.SNAT, To: netip.AddrPortFrom(a, 0)}
}

// HostIPTables is the host rule with iptables, for each family: the
// chain ISTIO_POSTRT of the nat table (declared, so emptied when there),
// a jump to it at the head of POSTROUTING, and its rule: TCP from a local
// socket to an address of the family's probe ipset (ProbeIPSets) gets
// the probe address.
func HostIPTables(cfg Config) *ruleset.Tx {
	tx := &ruleset.Tx{}
	for _, f := range cfg.Families() {
		id := ruleset.TableID{Family: f.Tables(), Name: nat}
		tx.AddChain(id, ruleset.Chain{Name: ChainPostrouting})
		tx.InsertRule(id, 0, ruleset.Rule{Family: f, Chain: "POSTROUTING", Target: jump(ChainPostrouting)})
		tx.AddRule(id, ruleset.Rule{Family: f, Chain: ChainPostrouting, Target: snat(cfg.probeSNAT(f)), Match: []ruleset.Match{
			{Kind: ruleset.MatchSocketExists},
			proto("tcp"),
			{Kind: ruleset.MatchDstSet, Name: ProbeSetName(f)},
		}})
	}
	return tx
}

// HostNft is the host rule with native nftables, in the host's inet
// table istio-ambient-nat: the probe sets (declared, so their elements
// stay), the chain postrouting (emptied), and its rule for each family:
// TCP of kubelet's uid to an address of the family's set gets the probe
// address.
func HostNft(cfg Config) *ruleset.Tx {
	id := ruleset.TableID{Family: ruleset.Inet, Name: NftTablePrefix + nat}
	def := ruleset.Table{Family: id.Family, Name: id.Name}
	for _, f := range cfg.Families() {
		def.Sets = append(def.Sets, ruleset.Set{Name: ProbeSetName(f), Type: map[ruleset.IPVersion]string{ruleset.V4: "ipv4_addr", ruleset.V6: "ipv6_addr"}[f]})
	}
	base, _ := ruleset.IPTablesHook(nat, "POSTROUTING")
	chain := ruleset.Chain{Name: "postrouting", Base: &base}
	tx := (&ruleset.Tx{}).AddTable(def).AddChain(id, chain).FlushChain(id, chain.Name)
	for _, f := range cfg.Families() {
		tx.AddRule(id, ruleset.Rule{Family: f, Chain: chain.Name, Counter: true, Target: snat(cfg.probeSNAT(f)), Match: []ruleset.Match{
			proto("tcp"),
			{Kind: ruleset.MatchUID, Value: cfg.KubeletUID},
			{Kind: ruleset.MatchDstSet, Name: ProbeSetName(f)},
		}})
	}
	return tx
}

// ProbeIPSets creates the probe ipsets of iptables' host rule in the
// calling thread's network namespace when they are not there (hash:ip,
// with comments for the pods' names), as istio-cni creates them.
func ProbeIPSets(cfg Config) error {
	for _, f := range cfg.Families() {
		family := uint8(unix.AF_INET)
		if f == ruleset.V6 {
			family = unix.AF_INET6
		}
		name := ProbeSetName(f)
		if err := netlink.IpsetCreate(name, "hash:ip", netlink.IpsetCreateOptions{Replace: true, Comments: true, Family: family}); err != nil {
			return fmt.Errorf("create ipset %s: %w", name, err)
		}
	}
	return nil
}
