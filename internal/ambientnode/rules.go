package ambientnode

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/intercept/apply"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// The rules, in the pod's namespace (the calling thread's) and on the
// host, written through the firewall's front door: the rule model says
// what they are and what they own for the node's backend (package
// ambient), the firewall replaces and removes them whole (firewall.Replace,
// firewall.Remove). Installing is idempotent: the in-pod rules replace any
// the pod had (a pod whose overrides changed, an agent that restarted
// midway).

// native tells whether the rules are native nftables' (else iptables').
func (n *Node) native() bool { return n.o.Backend.Kind == firewall.NFTables }

// firewall is the firewall of the calling thread's namespace.
func (n *Node) firewall() firewall.Interface {
	if n.o.Firewall != nil {
		return n.o.Firewall()
	}
	return firewall.New(n.o.Backend)
}

// closeFirewall ends fw's use, waiting for the kernel when it must.
func closeFirewall(fw firewall.Interface) {
	if f := fw.Release(); f != nil {
		_ = f.Close()
	}
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

// installInPod installs the in-pod rules of a pod with overrides ov in
// the calling thread's namespace, in place of any there, and the policy
// routing.
func (n *Node) installInPod(ctx context.Context, ov ambient.Overrides) error {
	if err := apply.ApplySteps(n.routing()); err != nil {
		return fmt.Errorf("in-pod routing: %w", err)
	}
	fw := n.firewall()
	defer closeFirewall(fw)
	owned, tx := ambient.InPod(n.o.Config, ov, n.native())
	return firewall.Replace(ctx, fw, owned, tx)
}

// removeInPod removes the in-pod rules from the calling thread's
// namespace; none there is not an error.
func (n *Node) removeInPod(ctx context.Context) error {
	if err := apply.RemoveSteps(n.routing()); err != nil {
		return fmt.Errorf("in-pod routing: %w", err)
	}
	fw := n.firewall()
	defer closeFirewall(fw)
	return firewall.Remove(ctx, fw, ambient.InPodOwned(n.o.Config, n.native()))
}

// InstallHost installs the host rule and the probe sets, in the calling
// thread's namespace (the host's), in place of any there: the sets hold
// the addresses of the pods enrolled, and only them (an address of a pod
// whose DEL ran while no agent ran goes).
func (n *Node) InstallHost(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var probes []ruleset.Element
	for _, r := range n.pods {
		probes = append(probes, elements(r.UID, r.Ambient.IPs)...)
	}
	fw := n.firewall()
	defer closeFirewall(fw)
	owned, tx := ambient.Host(n.o.Config, n.native(), probes)
	if err := firewall.Replace(ctx, fw, owned, tx); err != nil {
		return fmt.Errorf("install the host's probe rule: %w", err)
	}
	return nil
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
	fw := n.firewall()
	defer closeFirewall(fw)
	owned, _ := ambient.Host(n.o.Config, n.native(), nil)
	if err := firewall.Remove(ctx, fw, owned); err != nil {
		return false, fmt.Errorf("remove the host's probe rule: %w", err)
	}
	return true, nil
}

// probeAddrs adds the pod's addresses to the probe sets (or removes
// them), in the calling thread's namespace (the host's); each is
// commented with the pod's uid, as istio-cni writes it. Adding one there,
// or removing one not there, is not an error.
func (n *Node) probeAddrs(ctx context.Context, uid string, ips []netip.Addr, add bool) error {
	fw := n.firewall()
	defer closeFirewall(fw)
	if err := fw.Apply(ctx, ambient.ProbeAddrs(n.o.Config, n.native(), elements(uid, ips), add)); err != nil {
		return fmt.Errorf("the probe sets, addresses %v: %w", ips, err)
	}
	return nil
}

// elements are the probe sets' elements of a pod's addresses.
func elements(uid string, ips []netip.Addr) []ruleset.Element {
	out := make([]ruleset.Element, 0, len(ips))
	for _, a := range ips {
		out = append(out, ruleset.Element{Addr: a.Unmap(), Comment: uid})
	}
	return out
}
