package addressing

import (
	"fmt"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
)

// TestPodSysctls: the settings the reference plugins make in the pod's
// namespace (bridge: accept_dad or enhanced_dad, arp_notify; both, with an
// IPv6 address: IPv6 on for lo and the interface, keep_addr_on_down).
func TestPodSysctls(t *testing.T) {
	v4 := &current.IPConfig{Address: cidr("198.18.16.5/24")}
	v6 := &current.IPConfig{Address: cidr("fd20::5/64")}
	v6b := &current.IPConfig{Address: cidr("fd20:1::5/64")}
	ipv6On := []string{
		"net/ipv6/conf/lo/disable_ipv6=0!",
		"net/ipv6/conf/eth0/disable_ipv6=0!",
		"net/ipv6/conf/eth0/keep_addr_on_down=1!",
	}
	for _, tc := range []struct {
		name string
		ips  []*current.IPConfig
		s    IfaceSysctls
		want []string
	}{
		{"ptp v4", []*current.IPConfig{v4}, IfaceSysctls{}, nil},
		{"ptp dual stack", []*current.IPConfig{v4, v6, v6b}, IfaceSysctls{}, ipv6On},
		{"bridge v4", []*current.IPConfig{v4}, IfaceSysctls{SetDAD: true, ArpNotify: true},
			[]string{"net/ipv6/conf/eth0/accept_dad=0", "net/ipv4/conf/eth0/arp_notify=1"}},
		{"bridge enabledad v6", []*current.IPConfig{v6}, IfaceSysctls{SetDAD: true, DAD: true, ArpNotify: true},
			append([]string{"net/ipv6/conf/eth0/enhanced_dad=1", "net/ipv6/conf/eth0/accept_dad=1", "net/ipv4/conf/eth0/arp_notify=1"}, ipv6On...)},
		{"bridge layer 2", nil, IfaceSysctls{SetDAD: true, ArpNotify: true},
			[]string{"net/ipv6/conf/eth0/accept_dad=0", "net/ipv4/conf/eth0/arp_notify=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, s := range PodSysctls("eth0", tc.ips, tc.s) {
				g := fmt.Sprintf("%s=%s", s.Key, s.Value)
				if s.Required {
					g += "!"
				}
				got = append(got, g)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %v\nwant %v", got, tc.want)
			}
		})
	}
}
