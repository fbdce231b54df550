package cniplugin

import (
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// FuzzDecode: whatever arrives on stdin, Decode never panics, and every
// failure is a CNI error with code 6 (not JSON) or 7 (bad value).
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.1.0","name":"n","type":"t"}`,
		`{"cniVersion":"1.1.0","name":"n","type":"t","log":{"file":"/tmp/x","level":"debug"}}`,
		`{"cniVersion":"1.0.0","name":"n","type":"t","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"198.18.0.2/24","interface":0}],"interfaces":[{"name":"eth0"}]}}`,
		`{"cniVersion":"0.2.0","name":"n","type":"t","prevResult":{"ip4":{"ip":"198.18.0.2/24"}}}`,
		`{"name":"n","type":"t","mtu":-1,"names":[],"nested":{}}`,
		``, `null`, `[]`, `{`, `"x"`,
		// prevResult entries the library decodes but no plugin can use: each
		// made a plugin panic before Decode rejected it.
		`{"cniVersion":"1.1.0","name":"n","type":"t","prevResult":{"cniVersion":"1.1.0","interfaces":[null],"ips":[null],"routes":[null]}}`,
		`{"cniVersion":"0.4.0","name":"n","type":"t","prevResult":{"cniVersion":"0.4.0","interfaces":[null],"ips":[{"version":"4","address":"198.18.0.2/24","interface":0}]}}`,
		`{"cniVersion":"1.0.0","name":"n","type":"t","prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"198.18.0.2/24","interface":7}]}}`,
		`{"cniVersion":"0.3.1","name":"n","type":"t","prevResult":{"cniVersion":"0.3.1","interfaces":[{"name":"eth0"}],"ips":[{"version":"6","address":"fd99::2/64","interface":-1},{"interface":0}]}}`,
		`{"cniVersion":"1.1.0","name":"n","type":"t","prevResult":{"cniVersion":"1.1.0","interfaces":{},"ips":"x","dns":null}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var conf testConf
		err := Decode(data, "t", &conf)
		if err == nil {
			if conf.Type != "t" {
				t.Fatalf("accepted type %q", conf.Type)
			}
			checkAcceptedPrevResult(t, &conf.Base)
			return
		}
		var e *types.Error
		if !errors.As(err, &e) {
			t.Fatalf("not a CNI error: %v", err)
		}
		if e.Code != 6 && e.Code != 7 {
			t.Fatalf("code %d for %q: %s", e.Code, data, e.Msg)
		}
	})
}

// checkAcceptedPrevResult: a prevResult that Decode accepted converts to the
// current version with every entry present and every ip with an address,
// which is what the plugins rely on (an interface index out of range names
// no interface: the plugins compare it, never index with it).
func checkAcceptedPrevResult(t *testing.T, b *Base) {
	t.Helper()
	r, err := b.PrevResultCurrent()
	if err != nil {
		t.Fatalf("accepted prevResult does not convert: %v", err)
	}
	if r == nil {
		return
	}
	for i, intf := range r.Interfaces {
		if intf == nil {
			t.Fatalf("accepted prevResult.interfaces[%d] null", i)
		}
	}
	for i, ip := range r.IPs {
		if ip == nil || ip.Address.IP == nil {
			t.Fatalf("accepted prevResult.ips[%d] without an address", i)
		}
	}
	for i, rt := range r.Routes {
		if rt == nil {
			t.Fatalf("accepted prevResult.routes[%d] null", i)
		}
	}
}

// TestDecodeDELKeepsGoing: DEL, which must always finish, drops the entries
// ADD refuses (and keeps the interfaces' positions), where ADD answers
// code 7 naming the entry.
func TestDecodeDELKeepsGoing(t *testing.T) {
	conf := []byte(`{"cniVersion":"1.1.0","name":"n","type":"t","prevResult":{"cniVersion":"1.1.0",` +
		`"interfaces":[null,{"name":"eth0"}],"ips":[null,{"interface":1},{"address":"198.18.0.2/24","interface":1}],"routes":[null]}}`)
	saved := command
	t.Cleanup(func() { command = saved })
	command = func() string { return "ADD" }
	var c testConf
	if err := Decode(conf, "t", &c); err == nil || !strings.Contains(err.Error(), "prevResult.interfaces[0]") {
		t.Fatalf("ADD: %v, want code 7 naming prevResult.interfaces[0]", err)
	}
	command = func() string { return "DEL" }
	c = testConf{}
	if err := Decode(conf, "t", &c); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	r, err := c.PrevResultCurrent()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Interfaces) != 2 || r.Interfaces[1].Name != "eth0" || len(r.IPs) != 1 || *r.IPs[0].Interface != 1 || len(r.Routes) != 0 {
		t.Fatalf("DEL's prevResult: %+v", r)
	}
	checkAcceptedPrevResult(t, &c.Base)
}
