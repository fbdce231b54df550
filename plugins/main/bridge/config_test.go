package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/cnierr"
)

func TestParseConfigDefaultsAndDerived(t *testing.T) {
	c, err := parseConfig([]byte(`{"cniVersion":"1.1.0","name":"n","type":"bridge","isDefaultGateway":true,
		"vlanTrunk":[{"id":7},{"minID":10,"maxID":12},{"id":11}],"args":{"cni":{"mac":"02:00:00:00:00:02"}}}`), "MAC=02:00:00:00:00:01")
	if err != nil {
		t.Fatal(err)
	}
	if c.Bridge != "cni0" {
		t.Errorf("default bridge %q, want cni0", c.Bridge)
	}
	if !c.IsGateway {
		t.Error("isDefaultGateway must imply isGateway")
	}
	if want := []int{7, 10, 11, 12}; !reflect.DeepEqual(c.vlans, want) {
		t.Errorf("trunk %v, want %v", c.vlans, want)
	}
	if !c.vlanFiltering() {
		t.Error("a trunk needs VLAN filtering")
	}
	if c.res.MAC.String() != "02:00:00:00:00:02" {
		t.Errorf("MAC %s: args.cni.mac must win over CNI_ARGS", c.res.MAC)
	}
	if c.res.Prefix != "veth" {
		t.Errorf("host prefix %q, want veth", c.res.Prefix)
	}
}

func TestParseConfigMACPrecedence(t *testing.T) {
	for _, tc := range []struct {
		conf, env, want string
	}{
		{`{}`, "IgnoreUnknown=1;K8S_POD_NAME=x;MAC=02:00:00:00:00:01", "02:00:00:00:00:01"},
		{`{"args":{"cni":{"mac":"02:00:00:00:00:02"}}}`, "MAC=02:00:00:00:00:01", "02:00:00:00:00:02"},
		{`{"runtimeConfig":{"mac":"02:00:00:00:00:03"},"args":{"cni":{"mac":"02:00:00:00:00:02"}}}`, "MAC=02:00:00:00:00:01", "02:00:00:00:00:03"},
		{`{}`, "", "<nil>"},
	} {
		conf := `{"cniVersion":"1.1.0","name":"n","type":"bridge"` + strings.TrimPrefix(tc.conf, "{")
		if tc.conf != "{}" {
			conf = strings.Replace(conf, `"bridge"`, `"bridge",`, 1)
		}
		c, err := parseConfig([]byte(conf), tc.env)
		if err != nil {
			t.Fatalf("%s: %v", conf, err)
		}
		got := "<nil>"
		if c.res.MAC != nil {
			got = c.res.MAC.String()
		}
		if got != tc.want {
			t.Errorf("%s with CNI_ARGS %q: MAC %s, want %s", tc.conf, tc.env, got, tc.want)
		}
	}
}

// TestParseConfigErrors: every invalid config is code 7 (or 6 for non-JSON)
// and the message names the field.
func TestParseConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, conf string
		code       uint
		field      string
	}{
		{"not json", `{"cniVersion":`, 6, ""},
		{"hairpin and promisc", `"hairpinMode":true,"promiscMode":true`, 7, "hairpinMode"},
		{"vlan too big", `"vlan":4095`, 7, "vlan"},
		{"vlan negative", `"vlan":-1`, 7, "vlan"},
		{"vlan not a number", `"vlan":"10"`, 7, "vlan"},
		{"trunk id", `"vlanTrunk":[{"id":0}]`, 7, "vlanTrunk[0].id"},
		{"trunk min missing", `"vlanTrunk":[{"maxID":5}]`, 7, "vlanTrunk[0].minID"},
		{"trunk max missing", `"vlanTrunk":[{"minID":5}]`, 7, "vlanTrunk[0].maxID"},
		{"trunk reversed", `"vlanTrunk":[{"id":3},{"minID":9,"maxID":5}]`, 7, "vlanTrunk[1]"},
		{"trunk max range", `"vlanTrunk":[{"minID":1,"maxID":5000}]`, 7, "vlanTrunk[0].maxID"},
		{"trunk null", `"vlanTrunk":[null]`, 7, "vlanTrunk[0]"},
		{"mtu", `"mtu":-5`, 7, "mtu"},
		{"mtu too small", `"mtu":20`, 7, "mtu"},
		{"backend", `"ipMasqBackend":"pf"`, 7, "ipMasqBackend"},
		{"mac", `"runtimeConfig":{"mac":"nonsense"}`, 7, "runtimeConfig.mac"},
		{"mac multicast", `"args":{"cni":{"mac":"01:00:5e:00:00:01"}}`, 7, "args.cni.mac"},
		{"bridge name", `"bridge":"a-bridge-name-too-long"`, 7, "bridge"},
		{"bridge name slash", `"bridge":"a/b"`, 7, "bridge"},
		{"vlan gateway name", `"bridge":"fifteen-chars-x","vlan":100`, 7, "bridge"},
		{"ipam without container iface", `"disableContainerInterface":true,"ipam":{"type":"host-local"}`, 7, "disableContainerInterface"},
		{"prefix", `"hostVethPrefix":"much-too-long-prefix"`, 7, "hostVethPrefix"},
		{"isGateway type", `"isGateway":"yes"`, 7, "isGateway"},
		{"wrong type", `"type":"ptp"`, 7, "type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf := tc.conf
			if !strings.HasPrefix(conf, "{") {
				conf = `{"cniVersion":"1.1.0","name":"n","type":"bridge",` + conf + `}`
				conf = strings.Replace(conf, `"type":"bridge","type":"ptp"`, `"type":"ptp"`, 1)
			}
			_, err := parseConfig([]byte(conf), "")
			if got := cnierr.Code(err); got != tc.code {
				t.Fatalf("code %d (%v), want %d", got, err, tc.code)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %q does not name %q", err, tc.field)
			}
		})
	}
}
