package main

import (
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/cniplugin"
	"github.com/meshwire/meshwire/internal/podveth"
)

const pluginType = "veth"

// refType is the reference plugin this one stands in for: a config written
// for "ptp" works when meshwire's veth binary is installed under that name.
const refType = "ptp"

type config struct {
	cniplugin.Base
	podveth.Common

	res podveth.Resolved // what the shared keys resolve to
}

func parseConfig(data []byte, envArgs string) (*config, error) {
	c := &config{}
	if err := cniplugin.Decode(data, pluginType, c); err != nil {
		if c.Type != refType {
			return nil, err
		}
		// "ptp" is accepted as this plugin's type: decode again as ptp.
		if err := cniplugin.Decode(data, refType, c); err != nil {
			return nil, err
		}
	}
	if c.IPAM.Type == "" {
		return nil, cnierr.Field("ipam.type", "missing: the veth plugin needs an IPAM plugin for the pod's addresses")
	}
	r, err := c.Common.Validate(envArgs)
	if err != nil {
		return nil, err
	}
	c.res = r
	return c, nil
}
