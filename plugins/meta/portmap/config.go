package main

import (
	"fmt"
	"net"
	"strings"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/cniplugin"
	"github.com/meshwire/meshwire/internal/firewall"
)

const pluginType = "portmap"

// DefaultMarkBit is the reference plugin's default masquerade mark bit
// (Kubernetes uses 14 and 15, Calico 20-31).
const DefaultMarkBit = 13

// PortMapEntry is one entry of the portMappings capability, as the CNI
// conventions define it.
type PortMapEntry struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

// rawConfig is the plugin config as the user (and the runtime) writes it:
// every key of the reference portmap plugin.
type rawConfig struct {
	cniplugin.Base
	Backend              *string   `json:"backend,omitempty"`
	SNAT                 *bool     `json:"snat,omitempty"`
	MasqAll              bool      `json:"masqAll,omitempty"`
	MarkMasqBit          *int      `json:"markMasqBit,omitempty"`
	ExternalSetMarkChain *string   `json:"externalSetMarkChain,omitempty"`
	ConditionsV4         *[]string `json:"conditionsV4,omitempty"`
	ConditionsV6         *[]string `json:"conditionsV6,omitempty"`
	RuntimeConfig        struct {
		PortMaps []PortMapEntry `json:"portMappings,omitempty"`
	} `json:"runtimeConfig,omitempty"`
}

// mapping is a validated port mapping.
type mapping struct {
	HostPort      int
	ContainerPort int
	Protocol      string // tcp, udp or sctp
	HostIP        net.IP // nil: every local address
}

// config is the validated, defaulted config the plugin works with.
type config struct {
	raw *rawConfig
	// Backend is the configured backend; nil means auto-detect.
	Backend *firewall.Backend
	// Implied is the backend kind that options only one backend has
	// (externalSetMarkChain, iptables- or nftables-style conditions) force
	// when no backend is configured; ImpliedBy names those options.
	Implied              firewall.Kind
	ImpliedBy            string
	SNAT                 bool
	MasqAll              bool
	MarkBit              int
	ExternalSetMarkChain string
	CondV4, CondV6       []string
	Mappings             []mapping
}

// validChainName: what iptables accepts as a chain name (at most 28
// letters, digits, '_', '.' or '-', not starting with '.' or '-').
func validChainName(s string) bool {
	if len(s) == 0 || len(s) > 28 || s[0] == '.' || s[0] == '-' {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// parseConfig decodes and validates stdin. It does not look at the host:
// auto-detection of the backend happens later, only when needed.
func parseConfig(data []byte) (*config, error) {
	var raw rawConfig
	if err := cniplugin.Decode(data, pluginType, &raw); err != nil {
		return nil, err
	}
	return validate(&raw)
}

func validate(raw *rawConfig) (*config, error) {
	c := &config{raw: raw, SNAT: true, MasqAll: raw.MasqAll, MarkBit: DefaultMarkBit}
	if raw.SNAT != nil {
		c.SNAT = *raw.SNAT
	}
	if raw.MarkMasqBit != nil && raw.ExternalSetMarkChain != nil {
		return nil, cnierr.Config("markMasqBit and externalSetMarkChain conflict: set only one (externalSetMarkChain hands marking to another chain, markMasqBit is the bit meshwire's own marking uses)")
	}
	if raw.MarkMasqBit != nil {
		if *raw.MarkMasqBit < 0 || *raw.MarkMasqBit > 31 {
			return nil, cnierr.Field("markMasqBit", "%d is out of range (0-31)", *raw.MarkMasqBit)
		}
		c.MarkBit = *raw.MarkMasqBit
	}
	if raw.ExternalSetMarkChain != nil {
		name := *raw.ExternalSetMarkChain
		if !validChainName(name) {
			return nil, cnierr.Field("externalSetMarkChain", "%q is not a valid iptables chain name (letters, digits, '_', '.', '-'; at most 28 characters)", name)
		}
		c.ExternalSetMarkChain = name
	}
	var err error
	if c.CondV4, err = conditions("conditionsV4", raw.ConditionsV4); err != nil {
		return nil, err
	}
	if c.CondV6, err = conditions("conditionsV6", raw.ConditionsV6); err != nil {
		return nil, err
	}
	if err := c.chooseBackend(raw); err != nil {
		return nil, err
	}
	for i, pm := range raw.RuntimeConfig.PortMaps {
		m, err := validMapping(i, pm)
		if err != nil {
			return nil, err
		}
		c.Mappings = append(c.Mappings, m)
	}
	return c, nil
}

func validMapping(i int, pm PortMapEntry) (mapping, error) {
	field := func(f string) string { return fmt.Sprintf("runtimeConfig.portMappings[%d].%s", i, f) }
	m := mapping{HostPort: pm.HostPort, ContainerPort: pm.ContainerPort}
	if pm.HostPort < 1 || pm.HostPort > 65535 {
		return m, cnierr.Field(field("hostPort"), "%d is not a port number (1-65535)", pm.HostPort)
	}
	if pm.ContainerPort < 1 || pm.ContainerPort > 65535 {
		return m, cnierr.Field(field("containerPort"), "%d is not a port number (1-65535)", pm.ContainerPort)
	}
	switch p := strings.ToLower(strings.TrimSpace(pm.Protocol)); p {
	case "":
		m.Protocol = "tcp"
	case "tcp", "udp", "sctp":
		m.Protocol = p
	default:
		return m, cnierr.Field(field("protocol"), "%q is not supported (want tcp, udp or sctp)", pm.Protocol)
	}
	if pm.HostIP != "" {
		ip := net.ParseIP(strings.TrimSpace(pm.HostIP))
		if ip == nil {
			return m, cnierr.Field(field("hostIP"), "%q is not an IP address", pm.HostIP)
		}
		if ip4 := ip.To4(); ip4 != nil {
			ip = ip4
		}
		m.HostIP = ip
	}
	return m, nil
}

// conditions validates extra match conditions. They end up inside an
// iptables-restore payload or an nft script, so characters that would end
// the rule (newlines, ';', '#') are refused.
func conditions(field string, raw *[]string) ([]string, error) {
	if raw == nil {
		return nil, nil
	}
	var out []string
	for i, s := range *raw {
		if strings.ContainsAny(s, "\n\r;#\x00") {
			return nil, cnierr.Field(fmt.Sprintf("%s[%d]", field, i), "%q contains a newline, ';', '#' or NUL, which cannot be part of a match condition", s)
		}
		if strings.TrimSpace(s) == "" {
			continue
		}
		out = append(out, s)
	}
	return out, nil
}

// conditionsKind tells which backend a condition list is written for, as the
// reference plugin does: iptables conditions start with '-' or '!', nftables
// ones never do. Empty for no conditions.
func conditionsKind(conds []string) firewall.Kind {
	if len(conds) == 0 {
		return ""
	}
	if c := strings.TrimSpace(conds[0]); c[0] == '-' || c[0] == '!' {
		return firewall.IPTables
	}
	return firewall.NFTables
}

// chooseBackend resolves the backend key against options that only make
// sense for one backend. Options for the other backend than the configured
// one are a conflict (code 7, naming both).
func (c *config) chooseBackend(raw *rawConfig) error {
	wants := map[firewall.Kind][]string{}
	if c.ExternalSetMarkChain != "" {
		wants[firewall.IPTables] = append(wants[firewall.IPTables], "externalSetMarkChain")
	}
	if k := conditionsKind(c.CondV4); k != "" {
		wants[k] = append(wants[k], "conditionsV4")
	}
	if k := conditionsKind(c.CondV6); k != "" {
		wants[k] = append(wants[k], "conditionsV6")
	}
	if len(wants[firewall.IPTables]) > 0 && len(wants[firewall.NFTables]) > 0 {
		return cnierr.Config("%s are iptables options but %s are nftables options: they conflict",
			strings.Join(wants[firewall.IPTables], ", "), strings.Join(wants[firewall.NFTables], ", "))
	}
	if raw.Backend != nil && strings.TrimSpace(*raw.Backend) != "" {
		b, err := firewall.Parse(*raw.Backend)
		if err != nil {
			return cnierr.Field("backend", "%v", err)
		}
		for kind, opts := range wants {
			if kind != b.Kind && len(opts) > 0 {
				return cnierr.Config("backend %q conflicts with %s (options of the %s backend)", *raw.Backend, strings.Join(opts, ", "), kind)
			}
		}
		c.Backend = &b
		return nil
	}
	for kind, opts := range wants {
		if len(opts) > 0 {
			c.Implied, c.ImpliedBy = kind, strings.Join(opts, ", ")
		}
	}
	return nil
}
