package ambient

import (
	"fmt"
	"net/netip"

	"github.com/meshwire/meshwire/internal/ruleset"
)

// The host rule, once per node: the node's own TCP connections to an
// enrolled pod (kubelet's probes) leave with the probe address as their
// source, which the pod's rules let through uncaptured. The enrolled
// pods' addresses are in the probe sets, which the node agent fills: sets
// of the host's inet table istio-ambient-nat with native nftables,
// ipsets with iptables.

// ProbeSetName is the probe set of family f: istio-inpod-probes-v4, -v6.
func ProbeSetName(f ruleset.IPVersion) string {
	return fmt.Sprintf("%s-v%d", ProbeSet, int(f))
}

// probeSet is the probe set of family f.
func probeSet(f ruleset.IPVersion) ruleset.Set { return ruleset.Set{Name: ProbeSetName(f), Family: f} }

// hostNft is the host's inet table with native nftables.
var hostNft = ruleset.TableID{Family: ruleset.Inet, Name: NftTablePrefix + nat}

// probeSetTable is where the probe set of family f is: in the host's inet
// table with native nftables, else among the ipsets.
func probeSetTable(f ruleset.IPVersion, native bool) ruleset.TableID {
	if native {
		return hostNft
	}
	return ruleset.IPSets(f)
}

func snat(a netip.Addr) ruleset.Target {
	return ruleset.Target{Kind: ruleset.SNAT, To: netip.AddrPortFrom(a, 0)}
}

// HostIPTables is the host rule with iptables, for each family: the
// chain ISTIO_POSTRT of the nat table (declared, so emptied when there),
// a jump to it at the head of POSTROUTING, and its rule: TCP from a local
// socket to an address of the family's probe ipset (Host declares it)
// gets the probe address.
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
	def := ruleset.Table{Family: hostNft.Family, Name: hostNft.Name}
	for _, f := range cfg.Families() {
		def.Sets = append(def.Sets, probeSet(f))
	}
	base, _ := ruleset.IPTablesHook(nat, "POSTROUTING")
	chain := ruleset.Chain{Name: "postrouting", Base: &base}
	tx := (&ruleset.Tx{}).AddTable(def).AddChain(hostNft, chain).FlushChain(hostNft, chain.Name)
	for _, f := range cfg.Families() {
		tx.AddRule(hostNft, ruleset.Rule{Family: f, Chain: chain.Name, Counter: true, Target: snat(cfg.probeSNAT(f)), Match: []ruleset.Match{
			proto("tcp"),
			{Kind: ruleset.MatchUID, Value: cfg.KubeletUID},
			{Kind: ruleset.MatchDstSet, Name: ProbeSetName(f)},
		}})
	}
	return tx
}

// Host is the host rule and its probe sets, with native nftables or
// iptables: what they own (replaced and removed whole through the
// firewall; the ipsets are kept by a replace), and the transaction that
// writes them in place of any the host had: the sets declared (an ipset
// hash:ip with comments, as istio-cni creates it) and emptied, then
// holding probes (the addresses of the pods enrolled), and the rule.
func Host(cfg Config, native bool, probes []ruleset.Element) (ruleset.Owned, *ruleset.Tx) {
	var owned ruleset.Owned
	tx := &ruleset.Tx{}
	if native {
		owned.Tables = []ruleset.TableID{hostNft}
		tx.Append(HostNft(cfg))
	}
	for _, f := range cfg.Families() {
		if !native {
			owned.Chains = append(owned.Chains, ruleset.OwnedChains{Table: ruleset.TableID{Family: f.Tables(), Name: nat}, Builtins: []string{"POSTROUTING"}, Chains: []string{ChainPostrouting}})
			owned.IPSets = append(owned.IPSets, probeSet(f))
			tx.AddSet(ruleset.IPSets(f), probeSet(f))
		}
		tx.FlushSet(probeSetTable(f, native), probeSet(f))
	}
	tx.Append(ProbeAddrs(cfg, native, probes, true))
	if !native {
		tx.Append(HostIPTables(cfg))
	}
	return owned, tx
}

// ProbeAddrs adds the addresses of elems (or removes them) to the probe
// sets of their families, those of the families the rules have; an
// element's comment is its pod's uid, as istio-cni writes it.
func ProbeAddrs(cfg Config, native bool, elems []ruleset.Element, add bool) *ruleset.Tx {
	tx := &ruleset.Tx{}
	for _, f := range cfg.Families() {
		var of []ruleset.Element
		for _, e := range elems {
			if e.Addr.Is4() == (f == ruleset.V4) {
				of = append(of, e)
			}
		}
		if add {
			tx.AddElements(probeSetTable(f, native), probeSet(f), of...)
		} else {
			tx.DestroyElements(probeSetTable(f, native), probeSet(f), of...)
		}
	}
	return tx
}
