package intercept

import (
	"fmt"
)

// StepKind is a kind of non-firewall change the rule set needs.
type StepKind int

const (
	// StepRule is a policy routing rule: fwmark Mark lookup Table.
	StepRule StepKind = iota
	// StepLocalRoute is "local default dev lo" in Table.
	StepLocalRoute
	// StepPassthroughAddr is ::6/128 on lo, the source address the proxy
	// uses for inbound passthrough over IPv6 (127.0.0.6 needs nothing).
	StepPassthroughAddr
)

// Step is one change outside the firewall, applied through netlink.
type Step struct {
	Kind   StepKind
	Family Family
	Mark   uint32
	Table  uint32
	// Mask and Priority of a rule: none (the whole mark, the kernel's
	// choice) when zero; ambient mode's rule has both.
	Mask, Priority uint32
}

// String renders the step as the equivalent iproute2 command (for dry-run
// output and golden files).
func (s Step) String() string {
	switch s.Kind {
	case StepRule:
		mark := fmt.Sprintf("0x%x", s.Mark)
		if s.Mask != 0 {
			mark += fmt.Sprintf("/0x%x", s.Mask)
		}
		if s.Priority != 0 {
			mark += fmt.Sprintf(" pref %d", s.Priority)
		}
		return fmt.Sprintf("ip -%d rule add fwmark %s lookup %d", s.Family, mark, s.Table)
	case StepLocalRoute:
		dst := "0.0.0.0/0"
		if s.Family == V6 {
			dst = "::/0"
		}
		return fmt.Sprintf("ip -%d route add local %s dev lo table %d", s.Family, dst, s.Table)
	case StepPassthroughAddr:
		return "ip -6 addr add ::6/128 dev lo"
	}
	return "?"
}

// Routing lists the steps cfg needs besides the firewall rules: for TPROXY,
// the policy routing that delivers marked packets locally, for each family
// in use; with IPv6, the passthrough source address.
func Routing(cfg Config, ipv6 bool) []Step {
	fams := []Family{V4}
	if ipv6 {
		fams = append(fams, V6)
	}
	var steps []Step
	if cfg.Mode == ModeTProxy {
		for _, f := range fams {
			steps = append(steps,
				Step{Kind: StepRule, Family: f, Mark: cfg.TProxyMark, Table: cfg.TProxyRouteTable},
				Step{Kind: StepLocalRoute, Family: f, Table: cfg.TProxyRouteTable})
		}
	}
	if ipv6 {
		steps = append(steps, Step{Kind: StepPassthroughAddr, Family: V6})
	}
	return steps
}
