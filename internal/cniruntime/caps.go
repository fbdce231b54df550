package cniruntime

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// PortMapping is one entry of the portMappings capability, as runtimes pass it.
type PortMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

// ParsePort reads --port values: [HOSTIP:]HOST:CONTAINER[/tcp|udp|sctp]. An
// IPv6 host IP is written in brackets: [::1]:8080:80.
func ParsePort(s string) (PortMapping, error) {
	pm := PortMapping{Protocol: "tcp"}
	spec := s
	if i := strings.LastIndexByte(spec, '/'); i >= 0 {
		pm.Protocol = strings.ToLower(spec[i+1:])
		spec = spec[:i]
		switch pm.Protocol {
		case "tcp", "udp", "sctp":
		default:
			return pm, fmt.Errorf("--port %q: protocol %q is not tcp, udp or sctp", s, pm.Protocol)
		}
	}
	if strings.HasPrefix(spec, "[") {
		end := strings.Index(spec, "]:")
		if end < 0 {
			return pm, fmt.Errorf("--port %q: unterminated [IPv6] host address", s)
		}
		pm.HostIP, spec = spec[1:end], spec[end+2:]
	}
	parts := strings.Split(spec, ":")
	switch {
	case len(parts) == 3 && pm.HostIP == "":
		pm.HostIP, parts = parts[0], parts[1:]
	case len(parts) != 2:
		return pm, fmt.Errorf("--port %q: want HOST:CONTAINER[/proto] or HOSTIP:HOST:CONTAINER[/proto]", s)
	}
	if pm.HostIP != "" && net.ParseIP(pm.HostIP) == nil {
		return pm, fmt.Errorf("--port %q: %q is not an IP address", s, pm.HostIP)
	}
	var err error
	if pm.HostPort, err = parsePortNumber(parts[0]); err != nil {
		return pm, fmt.Errorf("--port %q: host port: %v", s, err)
	}
	if pm.ContainerPort, err = parsePortNumber(parts[1]); err != nil {
		return pm, fmt.Errorf("--port %q: container port: %v", s, err)
	}
	return pm, nil
}

func parsePortNumber(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("%q is not a port number (1-65535)", s)
	}
	return n, nil
}

// Bandwidth is the bandwidth capability: rates in bits per second, bursts in
// bits, as the reference bandwidth plugin reads them.
type Bandwidth struct {
	IngressRate  uint64 `json:"ingressRate"`
	IngressBurst uint64 `json:"ingressBurst"`
	EgressRate   uint64 `json:"egressRate"`
	EgressBurst  uint64 `json:"egressBurst"`
}

var rateUnits = []struct {
	suffix string
	mult   float64
}{
	{"tbit", 1e12}, {"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1},
	{"tbps", 8e12}, {"gbps", 8e9}, {"mbps", 8e6}, {"kbps", 8e3}, {"bps", 8},
	{"t", 1e12}, {"g", 1e9}, {"m", 1e6}, {"k", 1e3},
}

// ParseRate reads a rate the way tc does: bits per second with an optional
// unit (bit, kbit, mbit, gbit, tbit, or k/m/g/t for the same), or bytes per
// second with bps, kbps, mbps, gbps, tbps.
func ParseRate(s string) (uint64, error) {
	v := strings.ToLower(strings.TrimSpace(s))
	mult := 1.0
	for _, u := range rateUnits {
		if strings.HasSuffix(v, u.suffix) {
			v, mult = strings.TrimSuffix(v, u.suffix), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 || f*mult < 1000 || f*mult > 1e13 {
		return 0, fmt.Errorf("--bandwidth %q: want a rate between 1kbit and 10tbit, such as 10mbit or 1gbit", s)
	}
	return uint64(f * mult), nil
}

// BandwidthFor shapes both directions at rate. The burst is 50 ms worth of
// traffic, at least 64 KiB: enough for TCP to reach the rate, small enough
// not to let a sender overshoot for long.
func BandwidthFor(rate uint64) Bandwidth {
	burst := rate / 20
	if min := uint64(64 * 1024 * 8); burst < min {
		burst = min
	}
	return Bandwidth{IngressRate: rate, IngressBurst: burst, EgressRate: rate, EgressBurst: burst}
}

// CapabilityArgs turns --port values (ParsePort) and a --bandwidth rate
// (ParseRate) into runtimeConfig capabilities; nil when there are none.
func CapabilityArgs(ports []string, bandwidth string) (map[string]any, error) {
	caps := map[string]any{}
	if len(ports) > 0 {
		var pms []PortMapping
		for _, p := range ports {
			pm, err := ParsePort(p)
			if err != nil {
				return nil, err
			}
			pms = append(pms, pm)
		}
		caps["portMappings"] = pms
	}
	if bandwidth != "" {
		rate, err := ParseRate(bandwidth)
		if err != nil {
			return nil, err
		}
		caps["bandwidth"] = BandwidthFor(rate)
	}
	if len(caps) == 0 {
		return nil, nil
	}
	return caps, nil
}
