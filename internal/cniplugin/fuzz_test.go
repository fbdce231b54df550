package cniplugin

import (
	"errors"
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
