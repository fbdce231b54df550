package installer

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
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
	// CNIVersion, when set, replaces the conflist's cniVersion: a runtime
	// whose libcni predates the default's (containerd 1.6 reads up to
	// 1.0.0) refuses the results otherwise (--cni-version).
	CNIVersion string
	Chain      ChainOptions
}

// ownVersions are the cniVersion values --cni-version accepts: those every
// meshwire plugin answers and a conflist may chain with.
var ownVersions = []string{"1.1.0", "1.0.0", "0.4.0", "0.3.1", "0.3.0"}

// CheckCNIVersion checks one --cni-version value.
func CheckCNIVersion(v string) error {
	for _, ok := range ownVersions {
		if v == ok {
			return nil
		}
	}
	return fmt.Errorf("cniVersion %q: want one of %s", v, strings.Join(ownVersions, ", "))
}

// OwnConflistWith returns the conflist meshwire writes without --chain:
// base (the built-in default) with o's changes. With no change asked for
// it returns base itself.
func OwnConflistWith(base []byte, o OwnOptions) ([]byte, error) {
	out := base
	if len(o.PodCIDRs) > 0 || o.CNIVersion != "" {
		var err error
		if out, err = reshape(out, o.PodCIDRs, o.CNIVersion); err != nil {
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

// CheckConflist checks a conflist meshwire is to write as its own (the
// built-in one or --conflist): a JSON object with a name, a cniVersion
// --cni-version accepts and a non-empty "plugins" list.
func CheckConflist(conf []byte) error {
	var c struct {
		Name       string            `json:"name"`
		CNIVersion string            `json:"cniVersion"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(conf, &c); err != nil {
		return fmt.Errorf("not a conflist: %v", err)
	}
	switch {
	case c.Name == "":
		return errors.New(`the conflist has no "name"`)
	case len(c.Plugins) == 0:
		return errors.New(`the conflist has no "plugins"`)
	}
	return CheckCNIVersion(c.CNIVersion)
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

// reshape sets the conflist's cniVersion (when version is not empty) and
// the ranges and routes of the host-local IPAM of every plugin that has one
// (when cidrs are given).
func reshape(conflist []byte, cidrs []string, version string) ([]byte, error) {
	if version != "" {
		if err := CheckCNIVersion(version); err != nil {
			return nil, err
		}
	}
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
	top, plugins, err := decodeConflist(conflist)
	if err != nil {
		return nil, err
	}
	if version != "" {
		top["cniVersion"] = version
	}
	found := len(cidrs) == 0
	for _, p := range plugins {
		if len(cidrs) == 0 {
			break
		}
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
