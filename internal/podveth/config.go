package podveth

// Common and Resolved are the config keys the veth-based interface plugins
// (bridge, veth) share with each other and with the reference plugins: mtu,
// ipMasq, ipMasqBackend, the container MAC from the "mac" capability,
// args.cni.mac or CNI_ARGS MAC=, and meshwire's hostVethPrefix.

import (
	"net"
	"strings"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/link"
)

// Common is embedded in the plugins' config structs.
type Common struct {
	MTU           int     `json:"mtu,omitempty"`
	IPMasq        bool    `json:"ipMasq,omitempty"`
	IPMasqBackend *string `json:"ipMasqBackend,omitempty"`
	// HostVethPrefix starts the host end's name (default "veth"); the rest is
	// a hash of the container id and interface name.
	HostVethPrefix string `json:"hostVethPrefix,omitempty"`
	Args           struct {
		CNI struct {
			MAC string `json:"mac,omitempty"`
		} `json:"cni,omitempty"`
	} `json:"args,omitempty"`
	RuntimeConfig struct {
		MAC string `json:"mac,omitempty"`
	} `json:"runtimeConfig,omitempty"`
}

// Resolved is what Validate derives from Common.
type Resolved struct {
	MAC     net.HardwareAddr // nil: kernel's random one
	Backend string           // "" for auto-detection
	Prefix  string
}

// Validate checks the shared keys. envArgs is CNI_ARGS; as with the
// reference plugins, the runtimeConfig MAC wins over args.cni.mac, which wins
// over CNI_ARGS MAC=.
func (c *Common) Validate(envArgs string) (Resolved, error) {
	var r Resolved
	if c.MTU < 0 || (c.MTU > 0 && c.MTU < 68) || c.MTU > 65535 {
		return r, cnierr.Field("mtu", "%d is not a usable MTU (68 to 65535, or 0 for the default)", c.MTU)
	}
	if c.IPMasqBackend != nil {
		b := strings.TrimSpace(*c.IPMasqBackend)
		if b != "" {
			if _, err := firewall.Parse(b); err != nil {
				return r, cnierr.Field("ipMasqBackend", "%v", err)
			}
		}
		r.Backend = b
	}
	r.Prefix = c.HostVethPrefix
	if r.Prefix == "" {
		r.Prefix = link.DefaultHostPrefix
	}
	if err := link.ValidPrefix(r.Prefix); err != nil {
		return r, cnierr.Field("hostVethPrefix", "%v", err)
	}
	mac, field := EnvMAC(envArgs), "CNI_ARGS MAC"
	if c.Args.CNI.MAC != "" {
		mac, field = c.Args.CNI.MAC, "args.cni.mac"
	}
	if c.RuntimeConfig.MAC != "" {
		mac, field = c.RuntimeConfig.MAC, "runtimeConfig.mac"
	}
	if mac != "" {
		hw, err := net.ParseMAC(mac)
		if err != nil || len(hw) != 6 {
			return r, cnierr.Field(field, "%q is not an Ethernet MAC address", mac)
		}
		if hw[0]&1 != 0 {
			return r, cnierr.Field(field, "%q is a multicast address", mac)
		}
		r.MAC = hw
	}
	return r, nil
}

// EnvMAC returns the MAC= value of CNI_ARGS (key matched case-insensitively;
// other keys are ignored, whatever IgnoreUnknown says).
func EnvMAC(envArgs string) string {
	for _, kv := range strings.Split(envArgs, ";") {
		k, v, ok := strings.Cut(kv, "=")
		if ok && strings.EqualFold(strings.TrimSpace(k), "MAC") {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
