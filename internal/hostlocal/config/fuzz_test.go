package config

import (
	"errors"
	"net"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// FuzzLoad: any stdin and CNI_ARGS either decode into ranges that satisfy
// the allocator's assumptions, or fail with a CNI error of code 4, 6 or 7.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(`{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"198.18.0.0/24"}}`), "")
	f.Add([]byte(`{"cniVersion":"0.2.0","name":"n","ipam":{"ranges":[[{"subnet":"198.18.0.0/24","rangeStart":"198.18.0.9","rangeEnd":"198.18.0.20","gateway":"198.18.0.1"}],[{"subnet":"fd10::/64"}]]}}`), "IP=198.18.0.10")
	f.Add([]byte(`{"cniVersion":"1.1.0","name":"n","ipam":{"ranges":[[{"subnet":"198.18.0.0/30"},{"subnet":"198.18.1.0/30"}]]},"runtimeConfig":{"ips":["198.18.0.2/30"],"ipRanges":[[{"subnet":"fd10:1::/126"}]]},"args":{"cni":{"ips":["fd10:1::2"]}}}`), "IgnoreUnknown=1;X=y")
	f.Add([]byte(`{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"198.18.0.0/24","routes":[{"dst":"0.0.0.0/0","gw":"198.18.0.1"}],"lockTimeout":"1s"}}`), "")
	f.Fuzz(func(t *testing.T, stdin []byte, cniArgs string) {
		c, err := Load(stdin, cniArgs)
		if err != nil {
			var e *types.Error
			if !errors.As(err, &e) || (e.Code != 4 && e.Code != 6 && e.Code != 7) {
				t.Fatalf("error %v is not a CNI error of code 4, 6 or 7", err)
			}
			return
		}
		if len(c.Ranges) == 0 || c.Network == "" || c.DataDir == "" || c.LockTimeout <= 0 {
			t.Fatalf("accepted an incomplete config: %+v", c)
		}
		v4, v6 := 0, 0
		for i, rs := range c.Ranges {
			if rs.IsIPv4() {
				v4++
			} else {
				v6++
			}
			for _, r := range rs {
				if len(r.RangeStart) != len(rs[0].RangeStart) || len(r.RangeEnd) != len(r.RangeStart) || len(r.Gateway) != len(r.RangeStart) || len(r.Subnet.IP) != len(r.RangeStart) {
					t.Fatalf("range %v mixes address forms", r)
				}
				if cmp(r.RangeStart, r.RangeEnd) > 0 || !r.Subnet.Contains(r.RangeStart) || !r.Subnet.Contains(r.RangeEnd) {
					t.Fatalf("range %v is not inside %v", r, r.Subnet)
				}
			}
			for j := i + 1; j < len(c.Ranges); j++ {
				if rs.Overlaps(c.Ranges[j]) {
					t.Fatalf("accepted overlapping sets %v and %v", rs, c.Ranges[j])
				}
			}
			a, r := rs.NextFree(nil, func(net.IP) bool { return false })
			if a != nil && (!rs.Contains(a) || a.Equal(r.Gateway)) {
				t.Fatalf("NextFree handed out %v from %v", a, rs)
			}
		}
		if old, _ := version.GreaterThanOrEqualTo(c.CNIVersion, "0.3.0"); !old && (v4 > 1 || v6 > 1) {
			t.Fatalf("version %q accepted %d IPv4 and %d IPv6 sets", c.CNIVersion, v4, v6)
		}
	})
}
