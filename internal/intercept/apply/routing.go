package apply

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/intercept"
)

// Routing is the policy routing of the namespace that TPROXY needs.
type Routing interface {
	// Apply ensures each step is in place (see ApplySteps).
	Apply(steps []intercept.Step) error
	// Remove removes each step that is present (see RemoveSteps).
	Remove(steps []intercept.Step) error
	// OfMark lists the policy rules of a mark, whatever their table, and
	// the local default routes of those tables, for both families.
	OfMark(mark uint32) []intercept.Step
}

// netlinkRouting is the calling thread's namespace's routing.
type netlinkRouting struct{}

func (netlinkRouting) Apply(steps []intercept.Step) error  { return ApplySteps(steps) }
func (netlinkRouting) Remove(steps []intercept.Step) error { return RemoveSteps(steps) }

func (netlinkRouting) OfMark(mark uint32) []intercept.Step {
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

func nlFamily(f intercept.Family) int {
	if f == intercept.V6 {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}

func localDefault(s intercept.Step, lo netlink.Link) *netlink.Route {
	dst := &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	if s.Family == intercept.V6 {
		dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	return &netlink.Route{LinkIndex: lo.Attrs().Index, Dst: dst, Table: int(s.Table), Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST, Family: nlFamily(s.Family)}
}

var passthroughV6 = &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("::6"), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}

// findRules returns the policy routing rules "fwmark Mark[/Mask] [pref
// Priority] lookup Table" of the step's family.
func findRules(s intercept.Step) ([]netlink.Rule, error) {
	rules, err := netlinksafe.RuleList(nlFamily(s.Family))
	if err != nil {
		return nil, fmt.Errorf("list %s rules: %w", s.Family, err)
	}
	var out []netlink.Rule
	for _, r := range rules {
		mask := s.Mask
		if mask == 0 {
			mask = 0xffffffff
		}
		if r.Mark == s.Mark && r.Table == int(s.Table) && (r.Mask == nil && mask == 0xffffffff || r.Mask != nil && *r.Mask == mask) &&
			(s.Priority == 0 || r.Priority == int(s.Priority)) {
			out = append(out, r)
		}
	}
	return out, nil
}

// eachStep runs fn for each step, with the namespace's lo.
func eachStep(steps []intercept.Step, fn func(intercept.Step, netlink.Link) error) error {
	if len(steps) == 0 {
		return nil
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	for _, s := range steps {
		if err := fn(s, lo); err != nil {
			return err
		}
	}
	return nil
}

// ApplySteps ensures each step is in place; steps already there are left
// as they are, so re-runs change nothing.
func ApplySteps(steps []intercept.Step) error {
	return eachStep(steps, func(s intercept.Step, lo netlink.Link) error {
		switch s.Kind {
		case intercept.StepRule:
			have, err := findRules(s)
			if err != nil {
				return err
			}
			if len(have) > 0 {
				return nil
			}
			r := netlink.NewRule()
			r.Family, r.Mark, r.Table = nlFamily(s.Family), s.Mark, int(s.Table)
			if s.Mask != 0 {
				r.Mask = &s.Mask
			}
			if s.Priority != 0 {
				r.Priority = int(s.Priority)
			}
			if err := netlink.RuleAdd(r); err != nil && !errors.Is(err, syscall.EEXIST) {
				return fmt.Errorf("%s: %w", s, err)
			}
		case intercept.StepLocalRoute:
			if err := netlink.RouteReplace(localDefault(s, lo)); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		case intercept.StepPassthroughAddr:
			if err := netlink.AddrReplace(lo, passthroughV6); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		return nil
	})
}

// MissingSteps lists the steps that are not in place (for CHECK).
func MissingSteps(steps []intercept.Step) ([]intercept.Step, error) {
	var missing []intercept.Step
	err := eachStep(steps, func(s intercept.Step, lo netlink.Link) error {
		present := false
		switch s.Kind {
		case intercept.StepRule:
			have, err := findRules(s)
			if err != nil {
				return err
			}
			present = len(have) > 0
		case intercept.StepLocalRoute:
			want := localDefault(s, lo)
			routes, err := netlinksafe.RouteListFiltered(want.Family, &netlink.Route{Table: want.Table}, netlink.RT_FILTER_TABLE)
			if err != nil {
				return fmt.Errorf("list routes of table %d: %w", s.Table, err)
			}
			for _, r := range routes {
				if r.Type == unix.RTN_LOCAL && r.LinkIndex == want.LinkIndex && (r.Dst == nil || isZeroPrefix(r.Dst.Mask)) {
					present = true
				}
			}
		case intercept.StepPassthroughAddr:
			addrs, err := netlinksafe.AddrList(lo, netlink.FAMILY_V6)
			if err != nil {
				return err
			}
			for _, a := range addrs {
				if a.IPNet.String() == passthroughV6.IPNet.String() {
					present = true
				}
			}
		}
		if !present {
			missing = append(missing, s)
		}
		return nil
	})
	return missing, err
}

func isZeroPrefix(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}

// RemoveSteps removes each step that is present; absent ones are fine.
func RemoveSteps(steps []intercept.Step) error {
	return eachStep(steps, func(s intercept.Step, lo netlink.Link) error {
		switch s.Kind {
		case intercept.StepRule:
			have, err := findRules(s)
			if err != nil {
				return err
			}
			for i := range have {
				if err := netlink.RuleDel(&have[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
					return fmt.Errorf("remove %s: %w", s, err)
				}
			}
		case intercept.StepLocalRoute:
			if err := netlink.RouteDel(localDefault(s, lo)); err != nil && !errors.Is(err, syscall.ESRCH) && !errors.Is(err, syscall.ENOENT) {
				return fmt.Errorf("remove %s: %w", s, err)
			}
		case intercept.StepPassthroughAddr:
			if err := netlink.AddrDel(lo, passthroughV6); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) && !errors.Is(err, syscall.ENOENT) {
				return fmt.Errorf("remove %s: %w", s, err)
			}
		}
		return nil
	})
}
