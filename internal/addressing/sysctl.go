package addressing

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	current "github.com/containernetworking/cni/pkg/types/100"
	vnetns "github.com/vishvananda/netns"

	"github.com/meshwire/meshwire/internal/netns"
)

// Sysctl is one setting under /proc/sys of the pod's namespace.
type Sysctl struct {
	Key   string // below /proc/sys, slash-separated: "net/ipv6/conf/eth0/accept_dad"
	Value string
	// Required makes a failed write an error; the others are best effort.
	// A key that cannot be read (no IPv6 in the kernel) is skipped either
	// way: there is nothing to set.
	Required bool
}

// IfaceSysctls selects the per-interface settings of PodSysctls.
type IfaceSysctls struct {
	// SetDAD writes accept_dad as the reference bridge plugin does: 0, or
	// 1 with enhanced_dad 1 when DAD (its enabledad) asks for duplicate
	// address detection. Without it accept_dad stays as the kernel has it
	// (the reference ptp plugin).
	SetDAD, DAD bool
	// ArpNotify sets arp_notify 1: the kernel announces the interface's
	// addresses when it comes up or changes MAC (the reference bridge).
	ArpNotify bool
}

// PodSysctls lists what the reference plugins set in the pod's namespace
// before they add the addresses of ips to ifName: what s asks for, and,
// when an address is IPv6 (the reference's ipam.ConfigureIface), IPv6
// enabled on lo and ifName (disable_ipv6 0: a runtime may create
// namespaces with IPv6 disabled, and an IPv6 address could not be added)
// and keep_addr_on_down 1 on ifName (the addresses survive the interface
// going down and up).
func PodSysctls(ifName string, ips []*current.IPConfig, s IfaceSysctls) []Sysctl {
	conf := func(fam, dev, key string) string { return "net/" + fam + "/conf/" + dev + "/" + key }
	var out []Sysctl
	if s.SetDAD {
		if s.DAD {
			out = append(out,
				Sysctl{Key: conf("ipv6", ifName, "enhanced_dad"), Value: "1"},
				Sysctl{Key: conf("ipv6", ifName, "accept_dad"), Value: "1"})
		} else {
			out = append(out, Sysctl{Key: conf("ipv6", ifName, "accept_dad"), Value: "0"})
		}
	}
	if s.ArpNotify {
		out = append(out, Sysctl{Key: conf("ipv4", ifName, "arp_notify"), Value: "1"})
	}
	for _, ip := range ips {
		if ip.Address.IP.To4() == nil {
			out = append(out,
				Sysctl{Key: conf("ipv6", "lo", "disable_ipv6"), Value: "0", Required: true},
				Sysctl{Key: conf("ipv6", ifName, "disable_ipv6"), Value: "0", Required: true},
				Sysctl{Key: conf("ipv6", ifName, "keep_addr_on_down"), Value: "1", Required: true})
			break
		}
	}
	return out
}

// ApplySysctls writes list inside the namespace nsh, each key only when it
// holds another value (/proc/sys/net shows the namespace of the thread that
// opens it: netns.Enter runs the writes on a thread inside it).
func ApplySysctls(nsh vnetns.NsHandle, list []Sysctl) error {
	if len(list) == 0 {
		return nil
	}
	return netns.Enter(fmt.Sprintf("/proc/self/fd/%d", int(nsh)), func() error { return writeSysctls(list) })
}

func writeSysctls(list []Sysctl) error {
	for _, s := range list {
		p := filepath.Join("/proc/sys", s.Key)
		cur, err := os.ReadFile(p)
		if err != nil || strings.TrimSpace(string(cur)) == s.Value {
			continue
		}
		if err := os.WriteFile(p, []byte(s.Value), 0o644); err != nil && s.Required {
			return fmt.Errorf("set %s to %s: %w", strings.ReplaceAll(s.Key, "/", "."), s.Value, err)
		}
	}
	return nil
}
