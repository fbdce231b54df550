package main

import (
	"fmt"
	"reflect"
	"testing"
)

// TestPlanPortVlans pins how vlan, vlanTrunk and preserveDefaultVlan
// interact, as in the reference v1.9.1's setupVeth: preserveDefaultVlan is
// false unless set, the port loses every VLAN the bridge gave it (VLAN 1, or
// the bridge's own default PVID), and a trunk without vlan gets VLAN 1 back
// as its native VLAN even when preserveDefaultVlan is explicitly false.
func TestPlanPortVlans(t *testing.T) {
	pvid := func(v uint16) vlanAdd { return vlanAdd{vid: v, pvid: true} }
	tagged := func(v uint16) vlanAdd { return vlanAdd{vid: v} }
	cases := []struct {
		keys string
		have []uint16 // what the bridge gave the new port
		want portVlanPlan
	}{
		{``, []uint16{1}, portVlanPlan{}},
		{`"preserveDefaultVlan":false`, []uint16{1}, portVlanPlan{}},
		{`"vlan":100`, []uint16{1}, portVlanPlan{del: []uint16{1}, add: []vlanAdd{pvid(100)}}},
		{`"vlan":100,"preserveDefaultVlan":false`, []uint16{1}, portVlanPlan{del: []uint16{1}, add: []vlanAdd{pvid(100)}}},
		{`"vlan":100,"preserveDefaultVlan":true`, []uint16{1}, portVlanPlan{add: []vlanAdd{pvid(100)}}},
		// A bridge whose default PVID is not 1: that VLAN goes, not VLAN 1.
		{`"vlan":100`, []uint16{10}, portVlanPlan{del: []uint16{10}, add: []vlanAdd{pvid(100)}}},
		// A bridge with default PVID 0 gives its ports no VLAN.
		{`"vlan":100`, nil, portVlanPlan{add: []vlanAdd{pvid(100)}}},
		{`"vlanTrunk":[{"id":5}]`, []uint16{1}, portVlanPlan{del: []uint16{1}, add: []vlanAdd{tagged(5), pvid(1)}}},
		{`"vlanTrunk":[{"id":5}],"preserveDefaultVlan":false`, []uint16{1}, portVlanPlan{del: []uint16{1}, add: []vlanAdd{tagged(5), pvid(1)}}},
		{`"vlanTrunk":[{"id":5}],"preserveDefaultVlan":true`, []uint16{1}, portVlanPlan{add: []vlanAdd{tagged(5), pvid(1)}}},
		{`"vlanTrunk":[{"id":5}]`, []uint16{10}, portVlanPlan{del: []uint16{10}, add: []vlanAdd{tagged(5), pvid(1)}}},
		{`"vlan":7,"vlanTrunk":[{"minID":10,"maxID":11}]`, []uint16{1}, portVlanPlan{del: []uint16{1}, add: []vlanAdd{pvid(7), tagged(10), tagged(11)}}},
	}
	for _, tc := range cases {
		conf := `{"cniVersion":"1.1.0","name":"n","type":"bridge"`
		if tc.keys != "" {
			conf += "," + tc.keys
		}
		conf += "}"
		c, err := parseConfig([]byte(conf), "")
		if err != nil {
			t.Fatalf("%s: %v", conf, err)
		}
		got := planPortVlans(tc.have, c.Vlan, c.vlans, c.PreserveDefaultVlan)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("{%s} on a port with VLANs %v: %s, want %s", tc.keys, tc.have, fmtPlan(got), fmtPlan(tc.want))
		}
	}
}

func fmtPlan(p portVlanPlan) string {
	return fmt.Sprintf("del %v add %+v", p.del, p.add)
}
