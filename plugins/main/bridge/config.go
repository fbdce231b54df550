package main

import (
	"sort"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/cniplugin"
	"github.com/meshwire/meshwire/internal/link"
	"github.com/meshwire/meshwire/internal/podveth"
)

const (
	pluginType    = "bridge"
	defaultBridge = "cni0"
)

// config is the bridge plugin's config: the reference's keys plus the
// shared veth keys (internal/podveth).
type config struct {
	cniplugin.Base
	podveth.Common
	Bridge                    string       `json:"bridge"`
	IsGateway                 bool         `json:"isGateway"`
	IsDefaultGateway          bool         `json:"isDefaultGateway"`
	ForceAddress              bool         `json:"forceAddress"`
	HairpinMode               bool         `json:"hairpinMode"`
	PromiscMode               bool         `json:"promiscMode"`
	Vlan                      int          `json:"vlan"`
	VlanTrunk                 []*vlanTrunk `json:"vlanTrunk,omitempty"`
	PreserveDefaultVlan       bool         `json:"preserveDefaultVlan"`
	MacSpoofChk               bool         `json:"macspoofchk,omitempty"`
	EnableDAD                 bool         `json:"enabledad,omitempty"`
	DisableContainerInterface bool         `json:"disableContainerInterface,omitempty"`
	PortIsolation             bool         `json:"portIsolation,omitempty"`

	// Derived by parseConfig.
	vlans []int
	res   podveth.Resolved // what the shared keys resolve to
}

type vlanTrunk struct {
	MinID *int `json:"minID,omitempty"`
	MaxID *int `json:"maxID,omitempty"`
	ID    *int `json:"id,omitempty"`
}

// parseConfig decodes and validates stdin; envArgs is CNI_ARGS.
func parseConfig(data []byte, envArgs string) (*config, error) {
	c := &config{Bridge: defaultBridge}
	if err := cniplugin.Decode(data, pluginType, c); err != nil {
		return nil, err
	}
	if c.Bridge == "" {
		c.Bridge = defaultBridge
	}
	if err := link.ValidIfName(c.Bridge); err != nil {
		return nil, cnierr.Field("bridge", "%v", err)
	}
	if c.IsDefaultGateway {
		c.IsGateway = true
	}
	if c.HairpinMode && c.PromiscMode {
		return nil, cnierr.Config("hairpinMode and promiscMode cannot both be set")
	}
	if c.Vlan < 0 || c.Vlan > 4094 {
		return nil, cnierr.Field("vlan", "%d is not a VLAN id (0 to 4094)", c.Vlan)
	}
	if c.Vlan != 0 && len(c.Bridge)+1+len(itoa(c.Vlan)) > link.IFNameSize {
		return nil, cnierr.Field("bridge", "%q is too long to name its VLAN %d gateway interface", c.Bridge, c.Vlan)
	}
	vlans, err := collectVlanTrunk(c.VlanTrunk)
	if err != nil {
		return nil, err
	}
	c.vlans = vlans
	if c.IPAM.Type != "" && c.DisableContainerInterface {
		return nil, cnierr.Config("disableContainerInterface cannot be used with ipam (the container interface stays down, so it cannot carry addresses)")
	}
	r, err := c.Common.Validate(envArgs)
	if err != nil {
		return nil, err
	}
	c.res = r
	return c, nil
}

// vlanFiltering reports whether the bridge needs VLAN filtering.
func (c *config) vlanFiltering() bool { return c.Vlan != 0 || c.VlanTrunk != nil }

// collectVlanTrunk expands vlanTrunk entries into a sorted list of VLAN ids,
// with the reference plugin's rules.
func collectVlanTrunk(trunk []*vlanTrunk) ([]int, error) {
	set := map[int]bool{}
	for i, t := range trunk {
		field := "vlanTrunk[" + itoa(i) + "]"
		if t == nil {
			return nil, cnierr.Field(field, "null entry")
		}
		switch {
		case t.MinID != nil && t.MaxID != nil:
			lo, hi := *t.MinID, *t.MaxID
			if lo <= 0 || lo > 4094 {
				return nil, cnierr.Field(field+".minID", "%d is not a VLAN id (1 to 4094)", lo)
			}
			if hi <= 0 || hi > 4094 {
				return nil, cnierr.Field(field+".maxID", "%d is not a VLAN id (1 to 4094)", hi)
			}
			if hi < lo {
				return nil, cnierr.Field(field, "minID %d is greater than maxID %d", lo, hi)
			}
			for v := lo; v <= hi; v++ {
				set[v] = true
			}
		case t.MinID == nil && t.MaxID != nil:
			return nil, cnierr.Field(field+".minID", "missing: minID and maxID go together")
		case t.MinID != nil && t.MaxID == nil:
			return nil, cnierr.Field(field+".maxID", "missing: minID and maxID go together")
		}
		if t.ID != nil {
			if *t.ID <= 0 || *t.ID > 4094 {
				return nil, cnierr.Field(field+".id", "%d is not a VLAN id (1 to 4094)", *t.ID)
			}
			set[*t.ID] = true
		}
	}
	if len(set) == 0 {
		return nil, nil
	}
	out := make([]int, 0, len(set))
	for v := range set {
		out = append(out, v)
	}
	sort.Ints(out)
	return out, nil
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	neg := n < 0
	if neg {
		n = -n
	}
	var b []byte
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	if neg {
		b = append([]byte{'-'}, b...)
	}
	return string(b)
}
