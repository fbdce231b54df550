package cniplugin

import (
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

type testConf struct {
	Base
	MTU    int      `json:"mtu"`
	Names  []string `json:"names"`
	Nested struct {
		Port int `json:"port"`
	} `json:"nested"`
}

func TestDecode(t *testing.T) {
	cases := []struct {
		name, in string
		code     uint
		mention  string
	}{
		{"ok", `{"cniVersion":"1.1.0","name":"n","type":"t","mtu":1400}`, 0, ""},
		{"ok unknown keys kept ignored", `{"cniVersion":"1.1.0","name":"n","type":"t","runtimeConfig":{"x":1},"whatever":true}`, 0, ""},
		{"empty", ``, 6, "empty"},
		{"blank", "  \n", 6, "empty"},
		{"syntax", `{"name":`, 6, "not valid JSON"},
		{"wrong type", `{"name":"n","type":"other"}`, 7, "type"},
		{"missing type", `{"name":"n"}`, 7, "type"},
		{"mtu string", `{"name":"n","type":"t","mtu":"big"}`, 7, "mtu"},
		{"names not list", `{"name":"n","type":"t","names":"a"}`, 7, "names"},
		{"nested port", `{"name":"n","type":"t","nested":{"port":"x"}}`, 7, "nested.port"},
		{"top-level list", `[1]`, 7, "object"},
		{"log relative", `{"name":"n","type":"t","log":{"file":"x.log"}}`, 7, "log.file"},
		{"log level", `{"name":"n","type":"t","log":{"file":"/x.log","level":"chatty"}}`, 7, "log.level"},
		{"log empty", `{"name":"n","type":"t","log":{}}`, 7, "log.file"},
		{"prevResult bad", `{"cniVersion":"1.0.0","name":"n","type":"t","prevResult":{"ips":[{"address":"x"}]}}`, 7, "prevResult"},
		{"prevResult ok", `{"cniVersion":"1.0.0","name":"n","type":"t","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"198.18.0.2/24"}]}}`, 0, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var conf testConf
			err := Decode([]byte(c.in), "t", &conf)
			if c.code == 0 {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			var e *types.Error
			if !errors.As(err, &e) {
				t.Fatalf("got %v, want CNI error %d", err, c.code)
			}
			if e.Code != c.code || !strings.Contains(e.Msg, c.mention) {
				t.Fatalf("got code %d %q, want %d mentioning %q", e.Code, e.Msg, c.code, c.mention)
			}
		})
	}
}

func TestPrevResult(t *testing.T) {
	var conf testConf
	in := `{"cniVersion":"0.4.0","name":"n","type":"t","prevResult":{"cniVersion":"0.4.0","interfaces":[{"name":"eth0"}],"ips":[{"version":"4","address":"198.18.0.2/24","interface":0}]}}`
	if err := Decode([]byte(in), "t", &conf); err != nil {
		t.Fatal(err)
	}
	r, err := conf.RequirePrevResult()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.IPs) != 1 || r.IPs[0].Address.String() != "198.18.0.2/24" || r.Interfaces[0].Name != "eth0" {
		t.Fatalf("prevResult not converted: %+v", r)
	}
	var none testConf
	if err := Decode([]byte(`{"name":"n","type":"t"}`), "t", &none); err != nil {
		t.Fatal(err)
	}
	if _, err := none.RequirePrevResult(); err == nil || !strings.Contains(err.Error(), "prevResult") {
		t.Fatalf("missing prevResult: %v", err)
	}
	if r, err := none.PrevResultCurrent(); r != nil || err != nil {
		t.Fatalf("PrevResultCurrent without one: %v %v", r, err)
	}
}
