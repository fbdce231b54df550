// Package config decodes host-local's IPAM config with the reference
// plugin's semantics (github.com/containernetworking/plugins host-local).
// It reads the "ranges" list of range sets, the legacy single range at the top level of
// "ipam", the "ipRanges" and "ips" capabilities, "args.cni.ips", CNI_ARGS
// "IP=", "routes", "resolvConf" and "dataDir". Errors are CNI error objects
// (code 7 for the config, 4 for CNI_ARGS) that name the field at fault, e.g.
// "ipam.ranges[1][0].rangeEnd".
package config

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/cniplugin"
	"github.com/meshwire/meshwire/internal/filelock"
)

// DefaultDataDir is where allocations live unless "dataDir" says otherwise
// (the reference's default, so an upgraded node keeps its allocations).
const DefaultDataDir = "/var/lib/cni/networks"

// IPAM is a decoded, validated and canonicalized host-local config.
type IPAM struct {
	Network    string // the network name: allocations live in DataDir/Network
	CNIVersion string
	Ranges     []RangeSet // runtime ipRanges, then the legacy range, then "ranges"
	Routes     []*types.Route
	DataDir    string
	ResolvConf string
	// Requested are the addresses asked for by CNI_ARGS IP=, args.cni.ips
	// and the ips capability, in that order.
	Requested []net.IP
	// LockTimeout bounds the wait for the store's lock (meshwire's
	// "lockTimeout", default filelock.DefaultTimeout); past it ADD fails
	// with code 11.
	LockTimeout time.Duration
	// PrevResult is the prevResult an interface plugin passes on CHECK.
	PrevResult types.Result
}

// rawRange is one range as written in JSON; addresses stay strings so that
// errors can name the field and quote the value.
type rawRange struct {
	Subnet     string `json:"subnet"`
	RangeStart string `json:"rangeStart,omitempty"`
	RangeEnd   string `json:"rangeEnd,omitempty"`
	Gateway    string `json:"gateway,omitempty"`
}

type rawIPAM struct {
	rawRange
	Type        string           `json:"type"`
	Routes      []*types.Route   `json:"routes"`
	DataDir     string           `json:"dataDir"`
	ResolvConf  string           `json:"resolvConf"`
	Ranges      [][]rawRange     `json:"ranges"`
	LockTimeout *json.RawMessage `json:"lockTimeout"`
}

type rawNet struct {
	types.PluginConf
	IPAM          *rawIPAM `json:"ipam"`
	RuntimeConfig struct {
		IPRanges [][]rawRange `json:"ipRanges,omitempty"`
		IPs      []string     `json:"ips,omitempty"`
	} `json:"runtimeConfig,omitempty"`
	Args *struct {
		A *struct {
			IPs []string `json:"ips"`
		} `json:"cni"`
	} `json:"args"`
}

// envArgs is CNI_ARGS as the reference reads it: IP= plus the common
// IgnoreUnknown; other keys are an error unless IgnoreUnknown is set.
type envArgs struct {
	types.CommonArgs
	IP argIP `json:"ip,omitempty"`
}

// argIP is CNI_ARGS' IP= value: an address, optionally with a prefix length.
type argIP struct{ ip net.IP }

func (a *argIP) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	p, err := parseRequested(string(b))
	if err != nil {
		return err
	}
	a.ip = p
	return nil
}

// Load decodes the plugin's stdin and CNI_ARGS.
func Load(stdin []byte, cniArgs string) (*IPAM, error) {
	var n rawNet
	if err := cniplugin.Unmarshal(stdin, &n, ""); err != nil {
		return nil, err
	}
	if n.Name == "" {
		return nil, cnierr.Field("name", "missing: the network name names the directory holding the allocations")
	}
	if strings.ContainsAny(n.Name, "/\x00") || n.Name == "." || n.Name == ".." {
		return nil, cnierr.Field("name", "%q cannot be used as a directory name", n.Name)
	}
	if n.IPAM == nil {
		return nil, cnierr.Field("ipam", "missing: host-local needs an \"ipam\" object with its ranges")
	}
	c := &IPAM{
		Network:     n.Name,
		CNIVersion:  n.CNIVersion,
		Routes:      n.IPAM.Routes,
		DataDir:     n.IPAM.DataDir,
		ResolvConf:  n.IPAM.ResolvConf,
		LockTimeout: filelock.DefaultTimeout,
	}
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if n.IPAM.LockTimeout != nil {
		d, err := parseDuration(*n.IPAM.LockTimeout)
		if err != nil {
			return nil, cnierr.Field("ipam.lockTimeout", "%v", err)
		}
		c.LockTimeout = d
	}
	for i, r := range n.IPAM.Routes {
		if r == nil || r.Dst.IP == nil {
			return nil, cnierr.Field(fmt.Sprintf("ipam.routes[%d].dst", i), "missing")
		}
	}

	if err := c.loadRequested(&n, cniArgs); err != nil {
		return nil, err
	}

	// Range sets in the reference's order: the ipRanges capability, then the
	// legacy single range, then "ranges".
	type source struct {
		field string
		set   []rawRange
	}
	var sets []source
	for i, s := range n.RuntimeConfig.IPRanges {
		sets = append(sets, source{fmt.Sprintf("runtimeConfig.ipRanges[%d]", i), s})
	}
	if n.IPAM.Subnet != "" {
		sets = append(sets, source{"ipam", []rawRange{n.IPAM.rawRange}})
	}
	// Like the reference, rangeStart/rangeEnd/gateway at the top level of
	// ipam without a subnet are ignored.
	for i, s := range n.IPAM.Ranges {
		sets = append(sets, source{fmt.Sprintf("ipam.ranges[%d]", i), s})
	}
	if len(sets) == 0 {
		return nil, cnierr.Field("ipam.ranges", "no IP ranges specified (give \"ranges\", or \"subnet\" at the top level of ipam)")
	}
	fields := make([]string, len(sets))
	for i, s := range sets {
		field := s.field
		if field == "ipam" {
			fields[i] = "ipam.subnet"
		} else {
			fields[i] = field
		}
		rs, err := parseRangeSet(field, s.set)
		if err != nil {
			return nil, err
		}
		c.Ranges = append(c.Ranges, rs)
	}
	for i := range c.Ranges {
		for j := i + 1; j < len(c.Ranges); j++ {
			if c.Ranges[i].Overlaps(c.Ranges[j]) {
				return nil, cnierr.Field(fields[j], "range set %s overlaps with %s (%s)", c.Ranges[j], fields[i], c.Ranges[i])
			}
		}
	}
	if err := checkVersionLimit(c.CNIVersion, c.Ranges); err != nil {
		return nil, err
	}
	if n.RawPrevResult != nil {
		if err := cniplugin.ParsePrevResult(&n.PluginConf); err != nil {
			return nil, err
		}
		c.PrevResult = n.PrevResult
	}
	return c, nil
}

// checkVersionLimit: results of spec versions before 0.3.0 carry one "ip4"
// and one "ip6", so such a config may ask for one address per family.
func checkVersionLimit(cniVersion string, sets []RangeSet) error {
	v4, v6 := 0, 0
	for _, s := range sets {
		if s.IsIPv4() {
			v4++
		} else {
			v6++
		}
	}
	if v4 <= 1 && v6 <= 1 {
		return nil
	}
	if ok, err := version.GreaterThanOrEqualTo(cniVersion, "0.3.0"); err == nil && ok {
		return nil
	}
	return cnierr.Field("cniVersion", "%q allows one address per family (a result of that version has one ip4 and one ip6), but the config has %d IPv4 and %d IPv6 range sets", cniVersion, v4, v6)
}

func (c *IPAM) loadRequested(n *rawNet, cniArgs string) error {
	if cniArgs != "" {
		var e envArgs
		if err := types.LoadArgs(cniArgs, &e); err != nil {
			return cnierr.InvalidEnv("CNI_ARGS", "%v", err)
		}
		if e.IP.ip != nil {
			c.Requested = append(c.Requested, e.IP.ip)
		}
	}
	if n.Args != nil && n.Args.A != nil {
		for i, s := range n.Args.A.IPs {
			a, err := parseRequested(s)
			if err != nil {
				return cnierr.Field(fmt.Sprintf("args.cni.ips[%d]", i), "%v", err)
			}
			c.Requested = append(c.Requested, a)
		}
	}
	for i, s := range n.RuntimeConfig.IPs {
		a, err := parseRequested(s)
		if err != nil {
			return cnierr.Field(fmt.Sprintf("runtimeConfig.ips[%d]", i), "%v", err)
		}
		c.Requested = append(c.Requested, a)
	}
	return nil
}

// parseRequested accepts an address with or without a prefix length, as the
// reference does ("10.1.2.3" and "10.1.2.3/24" both ask for 10.1.2.3).
func parseRequested(s string) (net.IP, error) {
	var a net.IP
	if strings.Contains(s, "/") {
		a, _, _ = net.ParseCIDR(s)
	} else {
		a = net.ParseIP(s)
	}
	if a == nil {
		return nil, fmt.Errorf("%q is not an IP address", s)
	}
	return canonical(a), nil
}

func parseDuration(raw json.RawMessage) (time.Duration, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return 0, fmt.Errorf("expected a duration such as \"5s\", got %s", raw)
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q is not a positive duration such as \"5s\"", s)
	}
	return d, nil
}

// canonical returns the 4-byte form of IPv4 addresses and the 16-byte form
// of IPv6 ones.
func canonical(a net.IP) net.IP {
	if v4 := a.To4(); v4 != nil {
		return v4
	}
	return a.To16()
}
