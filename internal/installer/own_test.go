package installer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// defaultConflist is cmd/meshwire's built-in conflist.
func defaultConflist(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "cmd", "meshwire", "default.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ownView is what a test checks of a written conflist.
type ownView struct {
	Version string
	Types   []string
	Ranges  [][]map[string]string
	Routes  []map[string]string
}

func viewOwn(t *testing.T, conf []byte) ownView {
	t.Helper()
	var c struct {
		Version string `json:"cniVersion"`
		Plugins []struct {
			Type string `json:"type"`
			IPAM *struct {
				Ranges [][]map[string]string `json:"ranges"`
				Routes []map[string]string   `json:"routes"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(conf, &c); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, conf)
	}
	v := ownView{Version: c.Version}
	for _, p := range c.Plugins {
		v.Types = append(v.Types, p.Type)
		if p.IPAM != nil {
			v.Ranges, v.Routes = p.IPAM.Ranges, p.IPAM.Routes
		}
	}
	return v
}

func TestOwnConflistWith(t *testing.T) {
	base := defaultConflist(t)
	v4 := []map[string]string{{"dst": "0.0.0.0/0"}}
	for _, tc := range []struct {
		name string
		o    OwnOptions
		want ownView
	}{
		{"unchanged", OwnOptions{}, ownView{
			Version: "1.1.0",
			Types:   []string{"bridge", "portmap", "bandwidth"},
			Ranges:  [][]map[string]string{{{"subnet": "10.99.0.0/16"}}, {{"subnet": "fd99:6d77::/64"}}},
			Routes:  []map[string]string{{"dst": "0.0.0.0/0"}, {"dst": "::/0"}},
		}},
		{"ipv4 only", OwnOptions{PodCIDRs: []string{"198.18.0.0/16"}}, ownView{
			Types:  []string{"bridge", "portmap", "bandwidth"},
			Ranges: [][]map[string]string{{{"subnet": "198.18.0.0/16"}}},
			Routes: v4,
		}},
		{"dual stack, v6 first", OwnOptions{PodCIDRs: []string{"fd42:1::/64", "198.18.0.0/16"}}, ownView{
			Types:  []string{"bridge", "portmap", "bandwidth"},
			Ranges: [][]map[string]string{{{"subnet": "fd42:1::/64"}}, {{"subnet": "198.18.0.0/16"}}},
			Routes: []map[string]string{{"dst": "::/0"}, {"dst": "0.0.0.0/0"}},
		}},
		{"intercept", OwnOptions{Intercept: true}, ownView{
			Types:  []string{"bridge", "portmap", "bandwidth", "intercept"},
			Ranges: [][]map[string]string{{{"subnet": "10.99.0.0/16"}}, {{"subnet": "fd99:6d77::/64"}}},
			Routes: []map[string]string{{"dst": "0.0.0.0/0"}, {"dst": "::/0"}},
		}},
		{"cni version", OwnOptions{CNIVersion: "1.0.0"}, ownView{
			Version: "1.0.0",
			Types:   []string{"bridge", "portmap", "bandwidth"},
			Ranges:  [][]map[string]string{{{"subnet": "10.99.0.0/16"}}, {{"subnet": "fd99:6d77::/64"}}},
			Routes:  []map[string]string{{"dst": "0.0.0.0/0"}, {"dst": "::/0"}},
		}},
		{"cluster", OwnOptions{PodCIDRs: []string{"198.18.0.0/16"}, CNIVersion: "1.0.0", Intercept: true}, ownView{
			Version: "1.0.0",
			Types:   []string{"bridge", "portmap", "bandwidth", "intercept"},
			Ranges:  [][]map[string]string{{{"subnet": "198.18.0.0/16"}}},
			Routes:  v4,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := OwnConflistWith(base, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want.Version == "" {
				tc.want.Version = "1.1.0" // the default's
			}
			if got := viewOwn(t, out); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v\nwant %+v\n%s", got, tc.want, out)
			}
			if !tc.o.Intercept && len(tc.o.PodCIDRs) == 0 && tc.o.CNIVersion == "" && string(out) != string(base) {
				t.Errorf("no option changed the conflist:\n%s", out)
			}
			// The intercept entry is the one --chain adds: Unchain takes
			// it out again, and nothing else.
			if tc.o.Intercept {
				e, err := Unchain(out)
				if err != nil || !reflect.DeepEqual(e.Removed, []string{"intercept"}) {
					t.Errorf("Unchain: removed %v, %v", e.Removed, err)
				}
			}
		})
	}
}

func TestOwnConflistWithErrors(t *testing.T) {
	base := defaultConflist(t)
	for _, tc := range []struct {
		name, want string
		conf       []byte
		o          OwnOptions
	}{
		{"host bits", "host bits set", base, OwnOptions{PodCIDRs: []string{"198.18.0.1/16"}}},
		{"not a CIDR", "pod CIDR", base, OwnOptions{PodCIDRs: []string{"198.18.0.0"}}},
		{"unknown version", "want one of", base, OwnOptions{CNIVersion: "2.0.0"}},
		{"no host-local", "no plugin with host-local", []byte(`{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"loopback"}]}`), OwnOptions{PodCIDRs: []string{"198.18.0.0/16"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := OwnConflistWith(tc.conf, tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// New writes the shaped conflist, with the plugin log in every entry, and
// refuses the options with --chain.
func TestNewOwnOptions(t *testing.T) {
	n := newNode(t, false)
	in, err := New(Options{BinDir: n.bin, ConfDir: n.conf, SourceDir: n.src, DefaultConflist: defaultConflist(t),
		PodCIDRs: []string{"198.18.0.0/16"}, Intercept: true, PluginLog: "/var/log/meshwire/cni.log", Once: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Apply(); err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(filepath.Join(n.conf, OwnConflist))
	if err != nil {
		t.Fatal(err)
	}
	v := viewOwn(t, out)
	if want := []string{"bridge", "portmap", "bandwidth", "intercept"}; !reflect.DeepEqual(v.Types, want) {
		t.Errorf("plugins %v, want %v", v.Types, want)
	}
	if strings.Count(string(out), `"file": "/var/log/meshwire/cni.log"`) != 4 {
		t.Errorf("want the plugin log in every entry:\n%s", out)
	}
	if _, err := New(Options{BinDir: n.bin, ConfDir: n.conf, SourceDir: n.src, Chain: true, Intercept: true}); err == nil {
		t.Error("New accepted --intercept with --chain")
	}
}

func TestCheckConflist(t *testing.T) {
	if err := CheckConflist(defaultConflist(t)); err != nil {
		t.Errorf("the built-in conflist: %v", err)
	}
	for _, tc := range []struct{ conf, want string }{
		{`{"cniVersion":"1.0.0","name":"mwk","plugins":[{"type":"bridge"}]}`, ""},
		{`{"cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}`, `no "name"`},
		{`{"cniVersion":"1.0.0","name":"mwk","plugins":[]}`, `no "plugins"`},
		{`{"cniVersion":"1.0.0","name":"mwk","type":"bridge"}`, `no "plugins"`},
		{`{"cniVersion":"0.2.0","name":"mwk","plugins":[{"type":"bridge"}]}`, "want one of"},
		{`{"name":"mwk",`, "not a conflist"},
	} {
		err := CheckConflist([]byte(tc.conf))
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: got %v, want %q", tc.conf, err, tc.want)
		}
	}
	// New refuses a conflist to write that is not one.
	n := newNode(t, false)
	if _, err := New(Options{BinDir: n.bin, ConfDir: n.conf, SourceDir: n.src, DefaultConflist: []byte(`{"name":"x"}`)}); err == nil {
		t.Error("New accepted a conflist without plugins")
	}
}
