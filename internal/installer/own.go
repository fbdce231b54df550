package installer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
)

// OwnOptions shape the conflist meshwire writes without --chain.
type OwnOptions struct {
	// PodCIDRs, when set, replace the address ranges of the conflist's
	// host-local IPAM: one range set per CIDR, in this order, with a
	// default route for each address family given (--pod-cidr).
	PodCIDRs []string
	// Intercept appends the intercept entry --chain would add, with the
	// same ChainOptions, so that one file holds the primary network and
	// meshwire's interception (--intercept).
	Intercept bool
	Chain     ChainOptions
}

// OwnConflistWith returns the conflist meshwire writes without --chain:
// base (the built-in default) with o's changes. With no change asked for
// it returns base itself.
func OwnConflistWith(base []byte, o OwnOptions) ([]byte, error) {
	out := base
	if len(o.PodCIDRs) > 0 {
		var err error
		if out, err = withPodCIDRs(out, o.PodCIDRs); err != nil {
			return nil, err
		}
	}
	if o.Intercept {
		e, err := ChainWith(out, o.Chain)
		if err != nil {
			return nil, err
		}
		out = e.Out
	}
	return out, nil
}

// ParsePodCIDR checks one --pod-cidr value: a prefix whose host bits are
// zero, returned in canonical form.
func ParsePodCIDR(s string) (string, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return "", fmt.Errorf("pod CIDR %q: %v", s, err)
	}
	if p.Masked() != p {
		return "", fmt.Errorf("pod CIDR %q has host bits set (the network is %s)", s, p.Masked())
	}
	return p.String(), nil
}

// withPodCIDRs sets the ranges and routes of the host-local IPAM of every
// plugin that has one.
func withPodCIDRs(conflist []byte, cidrs []string) ([]byte, error) {
	var ranges []any
	var routes []any
	families := map[bool]bool{}
	for _, c := range cidrs {
		canon, err := ParsePodCIDR(c)
		if err != nil {
			return nil, err
		}
		p := netip.MustParsePrefix(canon)
		ranges = append(ranges, []any{map[string]any{"subnet": canon}})
		if !families[p.Addr().Is4()] {
			families[p.Addr().Is4()] = true
			dst := "::/0"
			if p.Addr().Is4() {
				dst = "0.0.0.0/0"
			}
			routes = append(routes, map[string]any{"dst": dst})
		}
	}
	d := json.NewDecoder(bytes.NewReader(conflist))
	d.UseNumber()
	var top map[string]any
	if err := d.Decode(&top); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	plugins, ok := top["plugins"].([]any)
	if !ok {
		return nil, errors.New(`no "plugins" list`)
	}
	found := false
	for _, p := range plugins {
		obj, _ := p.(map[string]any)
		ipam, _ := obj["ipam"].(map[string]any)
		if ipam == nil || ipam["type"] != "host-local" {
			continue
		}
		delete(ipam, "subnet") // the single-range form, replaced by ranges
		ipam["ranges"] = ranges
		ipam["routes"] = routes
		found = true
	}
	if !found {
		return nil, errors.New("no plugin with host-local IPAM to give the pod CIDRs to")
	}
	out, err := json.MarshalIndent(top, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}
