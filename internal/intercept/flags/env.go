package flags

import (
	"fmt"
	"net/netip"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"

	"github.com/meshwire/meshwire/internal/intercept"
)

// Env is what Parse reads besides the command line. A nil function reads
// nothing: no variable is set, no name resolves.
type Env struct {
	LookupEnv func(name string) (string, bool)
	// LookupUser and LookupGroup return the numeric id of a user or group
	// name (ENVOY_USER; group names in the owner group variables).
	LookupUser  func(name string) (string, error)
	LookupGroup func(name string) (string, error)
}

// SystemEnv is the process' environment and the system's user and group
// databases, as istio-iptables reads them.
func SystemEnv() Env {
	return Env{
		LookupEnv: os.LookupEnv,
		LookupUser: func(name string) (string, error) {
			u, err := user.Lookup(name)
			if err != nil {
				return "", err
			}
			return u.Uid, nil
		},
		LookupGroup: func(name string) (string, error) {
			g, err := user.LookupGroup(name)
			if err != nil {
				return "", err
			}
			return g.Gid, nil
		},
	}
}

// lookup returns a variable's value and whether it is set.
func (e Env) lookup(name string) (string, bool) {
	if e.LookupEnv == nil {
		return "", false
	}
	return e.LookupEnv(name)
}

// get returns a variable's value; empty counts as unset.
func (e Env) get(name string) string {
	v, _ := e.lookup(name)
	return strings.TrimSpace(v)
}

// Variables istio-iptables reads without a flag.
const (
	envOwnerGroups        = "ISTIO_OUTBOUND_OWNER_GROUPS"
	envOwnerGroupsExclude = "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE"
	envIPv4Loopback       = "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR"
	envEnvoyUser          = "ENVOY_USER"
	defaultEnvoyUser      = "istio-proxy"
)

// applyEnv sets each flag the command line left alone from its variables:
// the flag's own (ENVOY_PORT for --envoy-port), then its aliases, the last
// one set winning (istio binds them in that order); only when none is set,
// the first of its fallbacks that is.
func (p *parser) applyEnv() error {
	for _, d := range flagDefs {
		if p.fs.Changed(d.long) || d.noEnv {
			continue
		}
		name, v := p.envFor(d)
		if v == "" {
			continue
		}
		if err := p.fs.Set(d.long, v); err != nil {
			return &UsageError{Flag: flagName(d), Long: d.long, Msg: fmt.Sprintf("environment variable %s=%q: %v", name, v, err)}
		}
		p.fromEnv[d.long] = name
	}
	return nil
}

// envFor picks the variable that sets flag d and its value ("" for none).
func (p *parser) envFor(d flagDef) (name, value string) {
	for _, n := range append([]string{EnvName(d.long)}, d.envAliases...) {
		if v := p.env.get(n); v != "" {
			name, value = n, v
		}
	}
	for _, n := range d.envFallbacks {
		if v := p.env.get(n); value == "" && v != "" {
			name, value = n, v
		}
	}
	return name, value
}

// badEnv is a usage error about a variable that has no flag.
func badEnv(name, value, format string, a ...any) error {
	return &UsageError{Flag: fmt.Sprintf("environment variable %s=%q", name, value), Msg: fmt.Sprintf(format, a...)}
}

// envOnly reads the variables istio-iptables reads without a flag.
func (p *parser) envOnly() error {
	if err := p.ownerGroups(); err != nil {
		return err
	}
	return p.ipv4Loopback()
}

// ownerGroups reads ISTIO_OUTBOUND_OWNER_GROUPS ("*" when unset; set and
// empty, it captures nobody's connections, as in istio) and, with "*",
// ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE.
func (p *parser) ownerGroups() error {
	include, set := p.env.lookup(envOwnerGroups)
	include = strings.TrimSpace(include)
	exclude := p.env.get(envOwnerGroupsExclude)
	if !set || include == "*" {
		gids, err := p.groups(envOwnerGroupsExclude, exclude)
		p.o.Config.OutboundGroups = intercept.GroupFilter{GIDs: gids}
		return err
	}
	if exclude != "" {
		p.note("%s is ignored: %s is not \"*\" (as in istio-iptables)", envOwnerGroupsExclude, envOwnerGroups)
	}
	gids, err := p.groups(envOwnerGroups, include)
	if err == nil && len(gids) > intercept.MaxOnlyGroups {
		err = badEnv(envOwnerGroups, include, "%d groups; at most %d can be captured (they all go into one rule)", len(gids), intercept.MaxOnlyGroups)
	}
	p.o.Config.OutboundGroups = intercept.GroupFilter{Only: true, GIDs: gids}
	return err
}

// groups reads a list of group names and gids into gids.
func (p *parser) groups(name, list string) ([]uint32, error) {
	var out []uint32
	for _, g := range splitList(list) {
		gid, err := p.gid(g)
		if err != nil {
			return nil, badEnv(name, list, "%v", err)
		}
		if !slices.Contains(out, gid) {
			out = append(out, gid)
		}
	}
	return out, nil
}

func (p *parser) gid(g string) (uint32, error) {
	if g == "*" {
		return 0, fmt.Errorf(`"*" must stand alone`)
	}
	if n, err := strconv.ParseUint(g, 10, 32); err == nil && n != 0xffffffff {
		return uint32(n), nil
	}
	if p.env.LookupGroup == nil {
		return 0, fmt.Errorf("%q is not a gid (group names cannot be resolved here)", g)
	}
	s, err := p.env.LookupGroup(g)
	if err != nil {
		return 0, fmt.Errorf("%q is not a gid nor a known group: %v", g, err)
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("group %q has gid %q, not a number", g, s)
	}
	return uint32(n), nil
}

// ipv4Loopback reads ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR with istio's checks:
// an IPv4 loopback prefix of 8 to 32 bits.
func (p *parser) ipv4Loopback() error {
	v := p.env.get(envIPv4Loopback)
	if v == "" {
		return nil
	}
	pfx, err := netip.ParsePrefix(v)
	if err != nil || !pfx.Addr().Is4() || !pfx.Addr().IsLoopback() || pfx.Bits() < 8 {
		return badEnv(envIPv4Loopback, v, "want an IPv4 loopback CIDR with a mask of 8 to 32 bits (e.g. 127.0.0.1/32)")
	}
	p.o.Config.IPv4Loopback = pfx.Masked()
	return nil
}

// envoyUID is the default of --proxy-uid: the uid of user ENVOY_USER
// (istio-proxy when unset), or 1337 when there is no such user.
func (p *parser) envoyUID() string {
	name := p.env.get(envEnvoyUser)
	if name == "" {
		name = defaultEnvoyUser
	}
	if p.env.LookupUser != nil {
		if uid, err := p.env.LookupUser(name); err == nil {
			return uid
		}
	}
	return strconv.Itoa(intercept.DefaultProxyUID)
}

// note records something asked for that has no effect.
func (p *parser) note(format string, a ...any) {
	p.o.Notes = append(p.o.Notes, fmt.Sprintf(format, a...))
}
