package podveth

import (
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/cnierr"
)

func TestValidate(t *testing.T) {
	str := func(s string) *string { return &s }
	for _, tc := range []struct {
		name  string
		c     Common
		env   string
		field string // "" = valid
		mac   string
	}{
		{name: "empty"},
		{name: "mtu", c: Common{MTU: 1400}},
		{name: "mtu low", c: Common{MTU: 67}, field: "mtu"},
		{name: "mtu high", c: Common{MTU: 70000}, field: "mtu"},
		{name: "backend nftables", c: Common{IPMasqBackend: str("nftables")}},
		{name: "backend empty", c: Common{IPMasqBackend: str("")}},
		{name: "backend bad", c: Common{IPMasqBackend: str("ebtables")}, field: "ipMasqBackend"},
		{name: "env mac", env: "K8S_POD_NAME=a;mac=02:00:00:00:00:09", mac: "02:00:00:00:00:09"},
		{name: "env mac bad", env: "MAC=zz", field: "CNI_ARGS MAC"},
		{name: "prefix", c: Common{HostVethPrefix: "mwtb"}},
		{name: "prefix bad", c: Common{HostVethPrefix: "x y"}, field: "hostVethPrefix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := tc.c.Validate(tc.env)
			if tc.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				if got := r.MAC.String(); tc.mac != "" && got != tc.mac {
					t.Fatalf("MAC %s, want %s", got, tc.mac)
				}
				return
			}
			if cnierr.Code(err) != 7 || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("got %v, want code 7 naming %s", err, tc.field)
			}
		})
	}
}
