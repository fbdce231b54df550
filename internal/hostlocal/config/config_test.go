package config

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
)

// netConf wraps an ipam object (and optional extra top-level keys) into the
// config an interface plugin hands its IPAM plugin.
func netConf(version, ipam string, extra ...string) []byte {
	s := fmt.Sprintf(`{"cniVersion":%q,"name":"mwt-hl","type":"bridge","ipam":%s`, version, ipam)
	for _, e := range extra {
		s += "," + e
	}
	return []byte(s + "}")
}

// rangesString renders range sets as "start-end gw=G /mask" for comparison.
func rangesString(sets []RangeSet) string {
	var out []string
	for _, rs := range sets {
		var parts []string
		for _, r := range rs {
			ones, _ := r.Subnet.Mask.Size()
			parts = append(parts, fmt.Sprintf("%s-%s gw=%s /%d", r.RangeStart, r.RangeEnd, r.Gateway, ones))
		}
		out = append(out, strings.Join(parts, ","))
	}
	return strings.Join(out, "; ")
}

func TestLoadValid(t *testing.T) {
	cases := []struct {
		name      string
		conf      []byte
		cniArgs   string
		ranges    string
		requested string
	}{
		{
			name:   "legacy single range with defaults",
			conf:   netConf("1.1.0", `{"type":"host-local","subnet":"198.18.0.0/24"}`),
			ranges: "198.18.0.1-198.18.0.254 gw=198.18.0.1 /24",
		},
		{
			name:   "legacy single range with every field",
			conf:   netConf("0.3.1", `{"type":"host-local","subnet":"198.18.0.0/24","rangeStart":"198.18.0.10","rangeEnd":"198.18.0.20","gateway":"198.18.0.254"}`),
			ranges: "198.18.0.10-198.18.0.20 gw=198.18.0.254 /24",
		},
		{
			name:   "ranges, dual stack, IPv6 end is the last address",
			conf:   netConf("1.0.0", `{"type":"host-local","ranges":[[{"subnet":"198.18.1.0/24"}],[{"subnet":"fd10:0:0:1::/64"}]]}`),
			ranges: "198.18.1.1-198.18.1.254 gw=198.18.1.1 /24; fd10:0:0:1::1-fd10::1:ffff:ffff:ffff:ffff gw=fd10:0:0:1::1 /64",
		},
		{
			name:   "several ranges in one set",
			conf:   netConf("1.0.0", `{"type":"host-local","ranges":[[{"subnet":"198.18.1.0/24"},{"subnet":"198.18.2.0/25","rangeStart":"198.18.2.100"}]]}`),
			ranges: "198.18.1.1-198.18.1.254 gw=198.18.1.1 /24,198.18.2.100-198.18.2.126 gw=198.18.2.1 /25",
		},
		{
			name:   "ipRanges capability first, then legacy, then ranges",
			conf:   netConf("1.0.0", `{"type":"host-local","subnet":"198.18.3.0/24","ranges":[[{"subnet":"198.18.4.0/24"}]]}`, `"runtimeConfig":{"ipRanges":[[{"subnet":"198.18.5.0/30"}]]}`),
			ranges: "198.18.5.1-198.18.5.2 gw=198.18.5.1 /30; 198.18.3.1-198.18.3.254 gw=198.18.3.1 /24; 198.18.4.1-198.18.4.254 gw=198.18.4.1 /24",
		},
		{
			name:   "legacy keys without a subnet are ignored, as by the reference",
			conf:   netConf("1.0.0", `{"type":"host-local","rangeStart":"1.2.3.4","ranges":[[{"subnet":"198.18.4.0/24"}]]}`),
			ranges: "198.18.4.1-198.18.4.254 gw=198.18.4.1 /24",
		},
		{
			name:      "requested: CNI_ARGS, then args.cni.ips, then the ips capability",
			conf:      netConf("1.0.0", `{"ranges":[[{"subnet":"198.18.0.0/24"}],[{"subnet":"fd10::/64"}]]}`, `"args":{"cni":{"ips":["fd10::9"]}}`, `"runtimeConfig":{"ips":["198.18.0.7/24"]}`),
			cniArgs:   "IgnoreUnknown=1;K8S_POD_NAME=x;IP=198.18.0.5",
			ranges:    "198.18.0.1-198.18.0.254 gw=198.18.0.1 /24; fd10::1-fd10::ffff:ffff:ffff:ffff gw=fd10::1 /64",
			requested: "198.18.0.5 fd10::9 198.18.0.7",
		},
		{
			name:   "version 0.2.0 with one address per family",
			conf:   netConf("0.2.0", `{"ranges":[[{"subnet":"198.18.0.0/24"}],[{"subnet":"fd10::/64"}]]}`),
			ranges: "198.18.0.1-198.18.0.254 gw=198.18.0.1 /24; fd10::1-fd10::ffff:ffff:ffff:ffff gw=fd10::1 /64",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Load(c.conf, c.cniArgs)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if s := rangesString(got.Ranges); s != c.ranges {
				t.Fatalf("ranges\n got %s\nwant %s", s, c.ranges)
			}
			var req []string
			for _, r := range got.Requested {
				req = append(req, r.String())
			}
			if s := strings.Join(req, " "); s != c.requested {
				t.Fatalf("requested %q, want %q", s, c.requested)
			}
			if got.DataDir != DefaultDataDir || got.Network != "mwt-hl" {
				t.Fatalf("dataDir %q network %q", got.DataDir, got.Network)
			}
		})
	}
}

func TestLoadFields(t *testing.T) {
	c, err := Load(netConf("1.0.0", `{"subnet":"198.18.0.0/24","dataDir":"/tmp/x","resolvConf":"/etc/r","lockTimeout":"250ms","routes":[{"dst":"0.0.0.0/0"},{"dst":"198.18.8.0/24","gw":"198.18.0.9"}]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	if c.DataDir != "/tmp/x" || c.ResolvConf != "/etc/r" || c.LockTimeout != 250*time.Millisecond || len(c.Routes) != 2 || c.Routes[1].GW.String() != "198.18.0.9" {
		t.Fatalf("decoded %+v", c)
	}
}

func TestLoadInvalid(t *testing.T) {
	cases := []struct {
		name    string
		conf    []byte
		cniArgs string
		code    uint
		msg     string
	}{
		{"not json", []byte(`{"ipam":`), "", 6, ""},
		{"no ipam", []byte(`{"cniVersion":"1.0.0","name":"n"}`), "", 7, "ipam"},
		{"no name", []byte(`{"cniVersion":"1.0.0","ipam":{"subnet":"198.18.0.0/24"}}`), "", 7, "name"},
		{"name with a slash", []byte(`{"cniVersion":"1.0.0","name":"../etc","ipam":{"subnet":"198.18.0.0/24"}}`), "", 7, "name"},
		{"no ranges", netConf("1.0.0", `{"type":"host-local"}`), "", 7, "ipam.ranges"},
		{"empty range set", netConf("1.0.0", `{"ranges":[[]]}`), "", 7, "ipam.ranges[0]"},
		{"range without subnet", netConf("1.0.0", `{"ranges":[[{"rangeStart":"198.18.0.2"}]]}`), "", 7, "ipam.ranges[0][0].subnet"},
		{"bad subnet", netConf("1.0.0", `{"ranges":[[{"subnet":"198.18.0.0"}]]}`), "", 7, "ipam.ranges[0][0].subnet"},
		{"subnet wrong type", netConf("1.0.0", `{"ranges":[[{"subnet":5}]]}`), "", 7, "subnet"},
		{"/31", netConf("1.0.0", `{"subnet":"198.18.0.0/31"}`), "", 7, "too small"},
		{"/32", netConf("1.0.0", `{"subnet":"198.18.0.0/32"}`), "", 7, "ipam.subnet"},
		{"/127", netConf("1.0.0", `{"ranges":[[{"subnet":"fd10::/127"}]]}`), "", 7, "too small"},
		{"/128", netConf("1.0.0", `{"ranges":[[{"subnet":"fd10::/128"}]]}`), "", 7, "too small"},
		{"host bits", netConf("1.0.0", `{"ranges":[[{"subnet":"198.18.0.1/24"}]]}`), "", 7, "host bits"},
		{"start outside", netConf("1.0.0", `{"ranges":[[{"subnet":"198.18.0.0/24","rangeStart":"198.18.1.1"}]]}`), "", 7, "ipam.ranges[0][0].rangeStart"},
		{"end outside", netConf("1.0.0", `{"ranges":[[{"subnet":"198.18.0.0/24","rangeEnd":"198.18.1.1"}]]}`), "", 7, "ipam.ranges[0][0].rangeEnd"},
		{"end before start", netConf("1.0.0", `{"ranges":[[{"subnet":"198.18.0.0/24","rangeStart":"198.18.0.9","rangeEnd":"198.18.0.8"}]]}`), "", 7, "before rangeStart"},
		{"gateway not an address", netConf("1.0.0", `{"ranges":[[{"subnet":"198.18.0.0/24","gateway":"x"}]]}`), "", 7, "ipam.ranges[0][0].gateway"},
		{"gateway other family", netConf("1.0.0", `{"ranges":[[{"subnet":"198.18.0.0/24","gateway":"fd10::1"}]]}`), "", 7, "family"},
		{"mixed families in a set", netConf("1.0.0", `{"ranges":[[{"subnet":"198.18.0.0/24"},{"subnet":"fd10::/64"}]]}`), "", 7, "mixed"},
		{"overlap within a set", netConf("1.0.0", `{"ranges":[[{"subnet":"198.18.0.0/24"},{"subnet":"198.18.0.0/25"}]]}`), "", 7, "ipam.ranges[0][1]"},
		{"overlapping sets", netConf("1.0.0", `{"ranges":[[{"subnet":"198.18.0.0/24"}],[{"subnet":"198.18.0.128/25"}]]}`), "", 7, "overlaps"},
		{"legacy overlaps ranges", netConf("1.0.0", `{"subnet":"198.18.0.0/24","ranges":[[{"subnet":"198.18.0.0/24"}]]}`), "", 7, "ipam.ranges[0]"},
		{"two IPv4 sets before 0.3.0", netConf("0.2.0", `{"ranges":[[{"subnet":"198.18.0.0/24"}],[{"subnet":"198.18.1.0/24"}]]}`), "", 7, "cniVersion"},
		{"bad requested ip", netConf("1.0.0", `{"subnet":"198.18.0.0/24"}`, `"runtimeConfig":{"ips":["nope"]}`), "", 7, "runtimeConfig.ips[0]"},
		{"bad args ip", netConf("1.0.0", `{"subnet":"198.18.0.0/24"}`, `"args":{"cni":{"ips":["1.2.3"]}}`), "", 7, "args.cni.ips[0]"},
		{"bad CNI_ARGS ip", netConf("1.0.0", `{"subnet":"198.18.0.0/24"}`), "IP=nope", 4, "CNI_ARGS"},
		{"unknown CNI_ARGS key", netConf("1.0.0", `{"subnet":"198.18.0.0/24"}`), "FOO=bar", 4, "CNI_ARGS"},
		{"bad ipRanges", netConf("1.0.0", `{"subnet":"198.18.0.0/24"}`, `"runtimeConfig":{"ipRanges":[[{"subnet":"x"}]]}`), "", 7, "runtimeConfig.ipRanges[0][0].subnet"},
		{"route without dst", netConf("1.0.0", `{"subnet":"198.18.0.0/24","routes":[{"gw":"198.18.0.1"}]}`), "", 7, "ipam.routes[0].dst"},
		{"bad lockTimeout", netConf("1.0.0", `{"subnet":"198.18.0.0/24","lockTimeout":"soon"}`), "", 7, "ipam.lockTimeout"},
		{"bad prevResult", netConf("1.0.0", `{"subnet":"198.18.0.0/24"}`, `"prevResult":{"ips":[{"address":"x"}]}`), "", 7, "prevResult"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load(c.conf, c.cniArgs)
			var e *types.Error
			if !errors.As(err, &e) {
				t.Fatalf("Load = %v, want a CNI error", err)
			}
			if e.Code != c.code || !strings.Contains(e.Msg, c.msg) {
				t.Fatalf("got code %d %q, want code %d mentioning %q", e.Code, e.Msg, c.code, c.msg)
			}
		})
	}
}

func mustSet(t *testing.T, ipam string) RangeSet {
	t.Helper()
	c, err := Load(netConf("1.0.0", ipam), "")
	if err != nil {
		t.Fatal(err)
	}
	return c.Ranges[0]
}

func TestNextFree(t *testing.T) {
	two := `{"ranges":[[{"subnet":"198.18.0.0/29"},{"subnet":"198.18.1.0/29","rangeStart":"198.18.1.4","gateway":"198.18.1.5"}]]}`
	cases := []struct {
		name  string
		set   string
		last  string
		taken []string
		want  string
	}{
		{"first, skipping the gateway", `{"subnet":"198.18.0.0/29"}`, "", nil, "198.18.0.2"},
		{"after last", `{"subnet":"198.18.0.0/29"}`, "198.18.0.3", nil, "198.18.0.4"},
		{"last outside the set starts over", `{"subnet":"198.18.0.0/29"}`, "198.18.9.9", nil, "198.18.0.2"},
		{"wraps around to the start", `{"subnet":"198.18.0.0/29"}`, "198.18.0.6", nil, "198.18.0.2"},
		{"skips taken", `{"subnet":"198.18.0.0/29"}`, "198.18.0.2", []string{"198.18.0.3", "198.18.0.4"}, "198.18.0.5"},
		{"last itself comes last", `{"subnet":"198.18.0.0/29"}`, "198.18.0.4", []string{"198.18.0.2", "198.18.0.3", "198.18.0.5", "198.18.0.6"}, "198.18.0.4"},
		{"full", `{"subnet":"198.18.0.0/29"}`, "198.18.0.4", []string{"198.18.0.2", "198.18.0.3", "198.18.0.4", "198.18.0.5", "198.18.0.6"}, "<nil>"},
		{"gateway outside the range is never a problem", `{"subnet":"198.18.0.0/29","rangeStart":"198.18.0.4"}`, "", nil, "198.18.0.4"},
		{"next range of the set", two, "198.18.0.6", nil, "198.18.1.4"},
		{"next range skips its gateway", two, "198.18.1.4", nil, "198.18.1.6"},
		{"back to the first range", two, "198.18.1.6", nil, "198.18.0.2"},
		{"ipv6", `{"ranges":[[{"subnet":"fd10::/120","rangeStart":"fd10::fe"}]]}`, "fd10::ff", nil, "fd10::fe"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rs := mustSet(t, c.set)
			taken := map[string]bool{}
			for _, a := range c.taken {
				taken[a] = true
			}
			var last net.IP
			if c.last != "" {
				last = net.ParseIP(c.last)
			}
			got, r := rs.NextFree(last, func(a net.IP) bool { return taken[a.String()] })
			if got.String() != c.want {
				t.Fatalf("NextFree = %v, want %s", got, c.want)
			}
			if got != nil && (r == nil || !r.Contains(got)) {
				t.Fatalf("range %v does not hold %v", r, got)
			}
		})
	}
}

// TestNextFreeVisitsEveryAddressOnce: over a whole range set, the walk
// returns each allocatable address exactly once and never a gateway.
func TestNextFreeVisitsEveryAddressOnce(t *testing.T) {
	rs := mustSet(t, `{"ranges":[[{"subnet":"198.18.0.0/28","gateway":"198.18.0.9"},{"subnet":"198.18.2.0/29"}]]}`)
	taken := map[string]bool{}
	var last net.IP
	for {
		a, _ := rs.NextFree(last, func(a net.IP) bool { return taken[a.String()] })
		if a == nil {
			break
		}
		if taken[a.String()] {
			t.Fatalf("%s handed out twice", a)
		}
		taken[a.String()] = true
		last = a
	}
	// /28: .1-.14 minus gateway .9 = 13; /29: .1-.6 minus gateway .1 = 5.
	if len(taken) != 18 || taken["198.18.0.9"] || taken["198.18.2.1"] {
		t.Fatalf("handed out %d addresses: %v", len(taken), taken)
	}
}
