package ambientnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/intercept/apply"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// The rules, in the pod's namespace (the calling thread's) and on the
// host. Installing is idempotent: the in-pod rules replace any the pod
// had (a pod whose overrides changed, an agent that restarted midway).

func (n *Node) nft() bool { return n.o.Backend.Kind == firewall.NFTables }

// families are the iptables families of the rules.
func (n *Node) families() []ruleset.Family {
	var out []ruleset.Family
	for _, f := range n.o.Config.Families() {
		out = append(out, f.Tables())
	}
	return out
}

// routing is the in-pod policy routing (istio-cni's
// AddInpodMarkIPRule and AddLoopbackRoutes): for IPv6 only when the
// pod's lo has IPv6.
func (n *Node) routing() []intercept.Step {
	var steps []intercept.Step
	for _, f := range n.o.Config.Families() {
		steps = append(steps, intercept.Step{Kind: intercept.StepRule, Family: f, Mark: ambient.ConnMark, Mask: ambient.MarkMask, Priority: ambient.RulePriority, Table: ambient.RouteTable})
		if b, err := os.ReadFile("/proc/sys/net/ipv6/conf/lo/disable_ipv6"); f == ruleset.V6 && err == nil && strings.TrimSpace(string(b)) == "1" {
			continue
		}
		steps = append(steps, intercept.Step{Kind: intercept.StepLocalRoute, Family: f, Table: ambient.RouteTable})
	}
	return steps
}

// installInPod installs the in-pod rules of pod in the calling thread's
// namespace, in place of any there, and the policy routing.
func (n *Node) installInPod(ctx context.Context, ov ambient.Overrides) error {
	if err := apply.ApplySteps(n.routing()); err != nil {
		return fmt.Errorf("in-pod routing: %w", err)
	}
	fw := firewall.New(n.o.Backend)
	defer fw.Close()
	if n.nft() {
		// The transaction replaces istio-ambient-* whole.
		return fw.Apply(ctx, ambient.InPodNft(n.o.Config, ov))
	}
	if err := removeIPTables(ctx, fw, n.families(), []string{"mangle", "nat", "raw"}, []string{"PREROUTING", "OUTPUT"}, []string{ambient.ChainPrerouting, ambient.ChainOutput}); err != nil {
		return err
	}
	return fw.Apply(ctx, ambient.InPodIPTables(n.o.Config, ov))
}

// removeInPod removes the in-pod rules from the calling thread's
// namespace; none there is not an error.
func (n *Node) removeInPod(ctx context.Context) error {
	if err := apply.RemoveSteps(n.routing()); err != nil {
		return fmt.Errorf("in-pod routing: %w", err)
	}
	fw := firewall.New(n.o.Backend)
	defer fw.Close()
	if n.nft() {
		tx := &ruleset.Tx{}
		for _, t := range []string{"nat", "mangle", "raw"} {
			tx.DestroyTable(ruleset.TableID{Family: ruleset.Inet, Name: ambient.NftTablePrefix + t})
		}
		return fw.Apply(ctx, tx)
	}
	return removeIPTables(ctx, fw, n.families(), []string{"mangle", "nat", "raw"}, []string{"PREROUTING", "OUTPUT"}, []string{ambient.ChainPrerouting, ambient.ChainOutput})
}

// removeIPTables removes, from each table of each family, the jumps from
// the built-in chains to chains, then those chains.
func removeIPTables(ctx context.Context, fw firewall.Interface, fams []ruleset.Family, tables, builtins, chains []string) error {
	for _, fam := range fams {
		for _, table := range tables {
			if ok, err := fw.HasTable(ctx, fam, table); err != nil || !ok {
				if err != nil {
					return err
				}
				continue
			}
			for _, b := range builtins {
				if _, err := firewall.DeleteMatching(ctx, fw, fam, table, b, func(r installed.Rule) bool {
					return slices.Contains(chains, r.Jump)
				}); err != nil {
					return fmt.Errorf("remove the jumps of %s %s: %w", table, b, err)
				}
			}
			tx := &ruleset.Tx{}
			id := ruleset.TableID{Family: fam, Name: table}
			for _, c := range chains {
				ok, err := fw.HasChain(ctx, fam, table, c)
				if err != nil {
					return err
				}
				if ok {
					tx.FlushChain(id, c).DeleteChain(id, c)
				}
			}
			if !tx.Empty() {
				if err := fw.Apply(ctx, tx); err != nil {
					return fmt.Errorf("remove the chains of %s: %w", table, err)
				}
			}
		}
	}
	return nil
}

// InstallHost installs the host rule and the probe sets, in the calling
// thread's namespace (the host's), in place of any there, and puts back
// the addresses of the pods already enrolled.
func (n *Node) InstallHost(ctx context.Context) error {
	fw := firewall.New(n.o.Backend)
	defer fw.Close()
	if n.nft() {
		if err := fw.Apply(ctx, ambient.HostNft(n.o.Config)); err != nil {
			return fmt.Errorf("install the host's probe rule: %w", err)
		}
	} else {
		if err := ambient.ProbeIPSets(n.o.Config); err != nil {
			return err
		}
		if err := removeIPTables(ctx, fw, n.families(), []string{"nat"}, []string{"POSTROUTING"}, []string{ambient.ChainPostrouting}); err != nil {
			return err
		}
		if err := fw.Apply(ctx, ambient.HostIPTables(n.o.Config)); err != nil {
			return fmt.Errorf("install the host's probe rule: %w", err)
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []error
	for _, r := range n.pods {
		errs = append(errs, n.probeAddrs(ctx, r.UID, r.Ambient.IPs, true))
	}
	return errors.Join(errs...)
}

// RemoveHost removes the host rule and the probe sets, once no pod is
// enrolled; with pods enrolled it leaves them (their probes need them)
// and says so.
func (n *Node) RemoveHost(ctx context.Context) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.pods) > 0 {
		return false, nil
	}
	fw := firewall.New(n.o.Backend)
	defer fw.Close()
	if n.nft() {
		tx := (&ruleset.Tx{}).DestroyTable(ruleset.TableID{Family: ruleset.Inet, Name: ambient.NftTablePrefix + "nat"})
		return true, fw.Apply(ctx, tx)
	}
	if err := removeIPTables(ctx, fw, n.families(), []string{"nat"}, []string{"POSTROUTING"}, []string{ambient.ChainPostrouting}); err != nil {
		return false, err
	}
	for _, f := range n.o.Config.Families() {
		if err := netlink.IpsetDestroy(ambient.ProbeSetName(f)); err != nil && !errors.Is(err, unix.ENOENT) {
			return false, fmt.Errorf("remove ipset %s: %w", ambient.ProbeSetName(f), err)
		}
	}
	return true, nil
}

// probeAddrs adds the pod's addresses to the probe sets (or removes them),
// in the calling thread's namespace (the host's): the addresses of the
// families the rules have. Adding one there, or removing one not there,
// is not an error.
func (n *Node) probeAddrs(ctx context.Context, uid string, ips []netip.Addr, add bool) error {
	for _, a := range ips {
		f := ruleset.V4
		if a.Is6() {
			f = ruleset.V6
			if !n.o.Config.IPv6 {
				continue
			}
		}
		set := ambient.ProbeSetName(f)
		var err error
		if n.nft() {
			verb := "add"
			if !add {
				verb = "delete"
			}
			_, err = firewall.Nft(ctx, verb, "element", "inet", ambient.NftTablePrefix+"nat", set, "{ "+a.String()+" }")
			if err != nil && !add && strings.Contains(err.Error(), "No such file or directory") {
				err = nil
			}
		} else if add {
			// The comment is the pod's uid, as istio-cni writes it.
			err = netlink.IpsetAdd(set, &netlink.IPSetEntry{IP: net.IP(a.AsSlice()), Comment: uid, Replace: true})
		} else if err = netlink.IpsetDel(set, &netlink.IPSetEntry{IP: net.IP(a.AsSlice())}); errors.Is(err, unix.ENOENT) || isIPSetNotFound(err) {
			err = nil
		}
		if err != nil {
			return fmt.Errorf("probe set %s, address %s: %w", set, a, err)
		}
	}
	return nil
}

// isIPSetNotFound tells the kernel's answer to the removal of an element
// that is not in the set (IPSET_ERR_EXIST).
func isIPSetNotFound(err error) bool {
	return err != nil && (errors.Is(err, unix.Errno(4102)) || strings.Contains(err.Error(), "element is missing"))
}
