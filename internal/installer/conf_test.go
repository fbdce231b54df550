package installer

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func rawObject(t *testing.T, b []byte) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	return m
}

func rawPlugins(t *testing.T, b []byte) []json.RawMessage {
	t.Helper()
	var ps []json.RawMessage
	if err := json.Unmarshal(rawObject(t, b)["plugins"], &ps); err != nil {
		t.Fatalf("plugins: %v\n%s", err, b)
	}
	return ps
}

func TestPrimary(t *testing.T) {
	for _, tc := range []struct {
		names []string
		want  string
	}{
		{[]string{"10-calico.conflist", "calico-kubeconfig"}, "10-calico.conflist"},
		{[]string{"10-flannel.conflist", "05-cilium.conf"}, "05-cilium.conf"},
		{[]string{OwnConflist, "10-calico.conflist"}, "10-calico.conflist"},
		{[]string{".10-calico.conflist.meshwire-12345", "20-x.conflist"}, "20-x.conflist"},
		{[]string{".hidden.conf", "zz.json"}, "zz.json"},
		{[]string{"10-calico.conflist.bak", "10-calico.conflist.tmp", "99-loopback.conf"}, "99-loopback.conf"},
		{[]string{"10-b.json", "10-a.conflist", "10-a.conf"}, "10-a.conf"},
		{[]string{"README", "a.yaml"}, ""},
		{[]string{OwnConflist}, ""},
		{nil, ""},
	} {
		if got := Primary(tc.names); got != tc.want {
			t.Errorf("Primary(%q) = %q, want %q", tc.names, got, tc.want)
		}
	}
	if got := First([]string{"10-calico.conflist", OwnConflist}); got != OwnConflist {
		t.Errorf("First: %q", got)
	}
}

func TestConflistName(t *testing.T) {
	for in, want := range map[string]string{"05-cilium.conf": "05-cilium.conflist", "10-x.json": "10-x.conflist", "a.b.conf": "a.b.conflist"} {
		if got := ConflistName(in); got != want {
			t.Errorf("ConflistName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestChainFixtures chains the configs calico, flannel and cilium write,
// and checks what was added, that everything else is kept byte for byte,
// that a second run changes nothing, that libcni loads the result, and that
// Unchain restores the original (or, for a converted .conf, a list holding
// the original object).
func TestChainFixtures(t *testing.T) {
	for _, tc := range []struct {
		file      string
		added     []string
		converted bool
	}{
		{"10-calico.conflist", []string{"intercept"}, false},
		{"10-flannel.conflist", []string{"bandwidth", "intercept"}, false},
		{"05-cilium.conf", []string{"portmap", "bandwidth", "intercept"}, true},
	} {
		t.Run(tc.file, func(t *testing.T) {
			orig := fixture(t, tc.file)
			e, err := Chain(orig)
			if err != nil {
				t.Fatal(err)
			}
			if !e.Changed || e.Converted != tc.converted || !reflect.DeepEqual(e.Added, tc.added) || len(e.Removed) != 0 {
				t.Fatalf("Chain: changed %v converted %v added %q removed %q", e.Changed, e.Converted, e.Added, e.Removed)
			}
			t.Logf("chained:\n%s", e.Out)
			list, err := libcni.ConfListFromBytes(e.Out)
			if err != nil {
				t.Fatalf("libcni cannot load the result: %v\n%s", err, e.Out)
			}
			got, origTop := rawObject(t, e.Out), rawObject(t, orig)
			ps := rawPlugins(t, e.Out)
			var origPlugins []json.RawMessage
			if tc.converted {
				// The spec's conversion: top-level cniVersion and name,
				// the old object as the only plugin.
				if len(got) != 3 || !bytes.Equal(got["cniVersion"], origTop["cniVersion"]) || !bytes.Equal(got["name"], origTop["name"]) {
					t.Fatalf("converted top level: %s", e.Out)
				}
				origPlugins = []json.RawMessage{bytes.TrimSpace(orig)}
			} else {
				for k, v := range origTop {
					if k != "plugins" && !bytes.Equal(got[k], v) {
						t.Errorf("%s changed: %s -> %s", k, v, got[k])
					}
				}
				if len(got) != len(origTop) {
					t.Errorf("keys added or lost: %d -> %d", len(origTop), len(got))
				}
				origPlugins = rawPlugins(t, orig)
				// Text in front of the plugins array, key order and
				// formatting included, is untouched.
				at := bytes.Index(orig, []byte(`"plugins"`))
				if !bytes.Equal(e.Out[:at], orig[:at]) {
					t.Errorf("the text before plugins changed")
				}
			}
			if len(ps) != len(origPlugins)+len(tc.added) {
				t.Fatalf("%d plugins, want %d + %d", len(ps), len(origPlugins), len(tc.added))
			}
			for i, p := range origPlugins {
				if !bytes.Equal(ps[i], p) {
					t.Errorf("plugins[%d] changed:\n%s\n->\n%s", i, p, ps[i])
				}
			}
			for i, typ := range tc.added {
				var p map[string]any
				if err := json.Unmarshal(ps[len(origPlugins)+i], &p); err != nil {
					t.Fatal(err)
				}
				if p["type"] != typ || p[Marker] != true {
					t.Errorf("added plugin %d: %v", i, p)
				}
				caps, _ := p["capabilities"].(map[string]any)
				want := map[string]string{"portmap": "portMappings", "bandwidth": "bandwidth", "intercept": "io.kubernetes.cri.pod-annotations"}[typ]
				if caps[want] != true {
					t.Errorf("%s lacks the %s capability: %v", typ, want, p)
				}
				if typ == "intercept" && (p["istio-service-cidr"] != "*" || p["istio-inbound-ports"] != "*") {
					t.Errorf("intercept defaults: %v", p)
				}
			}
			if last := list.Plugins[len(list.Plugins)-1]; last.Network.Type != "intercept" {
				t.Errorf("last plugin is %q, want intercept", last.Network.Type)
			}

			again, err := Chain(e.Out)
			if err != nil || again.Changed || !bytes.Equal(again.Out, e.Out) || again.Converted {
				t.Fatalf("second Chain: changed %v, err %v\n%s", again.Changed, err, again.Out)
			}

			u, err := Unchain(e.Out)
			if err != nil || !u.Changed || !reflect.DeepEqual(u.Removed, tc.added) {
				t.Fatalf("Unchain: %+v %v", u, err)
			}
			if !tc.converted {
				if !bytes.Equal(u.Out, orig) {
					t.Fatalf("Unchain did not restore the original:\n%s\nwant\n%s", u.Out, orig)
				}
			} else {
				ps := rawPlugins(t, u.Out)
				top := rawObject(t, u.Out)
				if len(ps) != 1 || !bytes.Equal(ps[0], bytes.TrimSpace(orig)) || !bytes.Equal(top["name"], origTop["name"]) || !bytes.Equal(top["cniVersion"], origTop["cniVersion"]) {
					t.Fatalf("Unchain of the conversion is not the original as a list:\n%s", u.Out)
				}
				if _, err := libcni.ConfListFromBytes(u.Out); err != nil {
					t.Fatal(err)
				}
			}
			if u2, err := Unchain(u.Out); err != nil || u2.Changed || !bytes.Equal(u2.Out, u.Out) {
				t.Fatalf("second Unchain: %+v %v", u2, err)
			}
		})
	}
}

func TestChainText(t *testing.T) {
	const ic = `{"type":"intercept","capabilities":{"io.kubernetes.cri.pod-annotations":true},"istio-service-cidr":"*","istio-inbound-ports":"*","istio-local-exclude-ports":"15020","istio-local-outbound-ports-exclude":"15020","meshwire.io/installed":true}`
	const pm = `{"type":"portmap","capabilities":{"portMappings":true},"meshwire.io/installed":true}`
	const bw = `{"type":"bandwidth","capabilities":{"bandwidth":true},"meshwire.io/installed":true}`
	for _, tc := range []struct {
		name, in, want string
		added, removed []string
	}{
		{
			name:  "compact",
			in:    `{"name":"n","plugins":[{"type":"a"},{"type":"portmap"},{"type":"bandwidth"}]}`,
			want:  `{"name":"n","plugins":[{"type":"a"},{"type":"portmap"},{"type":"bandwidth"},` + ic + `]}`,
			added: []string{"intercept"},
		},
		{
			name:  "indented, trailing whitespace kept",
			in:    "{\"name\":\"n\",\n \"plugins\": [\n\t{\"type\":\"a\"} ,\n\t{\"type\":\"intercept\",\"x\":1}\n ]\n}\n",
			want:  "{\"name\":\"n\",\n \"plugins\": [\n\t{\"type\":\"a\"} ,\n\t{\"type\":\"intercept\",\"x\":1},\n\t" + pm + ",\n\t" + bw + "\n ]\n}\n",
			added: []string{"portmap", "bandwidth"},
		},
		{
			name:    "ours moved back to the end after another installer appended",
			in:      `{"name":"n","plugins":[{"type":"a"}, ` + pm + `, ` + bw + `, ` + ic + `, {"type":"other"}]}`,
			want:    `{"name":"n","plugins":[{"type":"a"}, {"type":"other"}, ` + pm + `, ` + bw + `, ` + ic + `]}`,
			added:   []string{"portmap", "bandwidth", "intercept"},
			removed: []string{"portmap", "bandwidth", "intercept"},
		},
		{
			name:    "ours reformatted by another installer",
			in:      `{"name":"n","plugins":[{"type":"a"},{"type":"portmap"},{"type":"bandwidth"},{"meshwire.io/installed": true, "type": "intercept"}]}`,
			want:    `{"name":"n","plugins":[{"type":"a"},{"type":"portmap"},{"type":"bandwidth"},` + ic + `]}`,
			added:   []string{"intercept"},
			removed: []string{"intercept"},
		},
		{
			name:    "duplicates of ours",
			in:      `{"name":"n","plugins":[{"type":"a"},{"type":"portmap"},{"type":"bandwidth"},` + ic + `,` + ic + `]}`,
			want:    `{"name":"n","plugins":[{"type":"a"},{"type":"portmap"},{"type":"bandwidth"},` + ic + `]}`,
			added:   []string{"intercept"},
			removed: []string{"intercept", "intercept"},
		},
		{
			name:  "a marker set to false is not ours",
			in:    `{"name":"n","plugins":[{"type":"a","meshwire.io/installed":false},{"type":"portmap"},{"type":"bandwidth"}]}`,
			want:  `{"name":"n","plugins":[{"type":"a","meshwire.io/installed":false},{"type":"portmap"},{"type":"bandwidth"},` + ic + `]}`,
			added: []string{"intercept"},
		},
		{
			name:  "single plugin without cniVersion",
			in:    `{"name":"n","type":"bridge"}`,
			want:  "{\n  \"name\": \"n\",\n  \"plugins\": [\n    {\"name\":\"n\",\"type\":\"bridge\"},\n    " + pm + ",\n    " + bw + ",\n    " + ic + "\n  ]\n}\n",
			added: []string{"portmap", "bandwidth", "intercept"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := Chain([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if string(e.Out) != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", e.Out, tc.want)
			}
			if !reflect.DeepEqual(e.Added, tc.added) || !reflect.DeepEqual(e.Removed, tc.removed) {
				t.Fatalf("added %q removed %q", e.Added, e.Removed)
			}
			if again, err := Chain(e.Out); err != nil || again.Changed {
				t.Fatalf("not idempotent: %v\n%s", err, again.Out)
			}
		})
	}
}

func TestChainErrors(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"not JSON", `{"name": "n", "plugins": [`, "not valid JSON"},
		{"empty", ``, "not valid JSON"},
		{"data after", `{"name":"n","type":"x"} {}`, "not valid JSON"},
		{"an array", `[{"type":"x"}]`, "not a JSON object"},
		{"plugins not a list", `{"name":"n","plugins":{"type":"x"}}`, "not a list"},
		{"no plugins", `{"name":"n","plugins":[]}`, "no plugin of its own"},
		{"only ours", `{"name":"n","plugins":[{"type":"intercept","meshwire.io/installed":true}]}`, "no plugin of its own"},
		{"old spec", `{"cniVersion":"0.2.0","name":"n","type":"bridge"}`, "predates chained plugins"},
		{"neither", `{"cniVersion":"0.3.1","name":"n"}`, "neither a config list"},
		{"no name", `{"cniVersion":"0.3.1","type":"bridge"}`, `no "name"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := Chain([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Chain: %v (%s), want an error with %q", err, e.Out, tc.want)
			}
		})
	}
	if _, err := Chain(fixture(t, "broken.conflist")); err == nil {
		t.Fatal("a truncated file chained")
	}
	if _, err := Unchain(fixture(t, "broken.conflist")); err == nil {
		t.Fatal("a truncated file unchained")
	}
}

func TestUnchainLeavesOthersAlone(t *testing.T) {
	for _, in := range []string{
		`{"cniVersion":"0.3.1","name":"n","type":"bridge"}`,
		`{"name":"n","plugins":[{"type":"a"},{"type":"intercept"}]}`,
		`{"name":"n","plugins":[{"type":"a","meshwire.io/installed":"yes"}]}`,
	} {
		e, err := Unchain([]byte(in))
		if err != nil || e.Changed || string(e.Out) != in {
			t.Errorf("Unchain(%s) = %s, %v, %v", in, e.Out, e.Changed, err)
		}
	}
	e, err := Unchain([]byte(`{"name":"n","plugins":[{"type":"intercept","meshwire.io/installed":true},{"type":"a"}]}`))
	if err != nil || string(e.Out) != `{"name":"n","plugins":[{"type":"a"}]}` {
		t.Errorf("Unchain of ours first: %s %v", e.Out, err)
	}
}

func TestEarlierConversion(t *testing.T) {
	single := fixture(t, "05-cilium.conf")
	chained, err := Chain(single)
	if err != nil {
		t.Fatal(err)
	}
	unchained, _ := Unchain(chained.Out)
	rewritten := []byte(`{"cniVersion":"1.0.0","name":"cilium","type":"cilium-cni","enable-debug":true}`)
	for _, tc := range []struct {
		name         string
		list, single []byte
		want         bool
	}{
		{"our conversion", chained.Out, single, true},
		{"left by cleanup", unchained.Out, single, true},
		{"the config rewritten since", chained.Out, rewritten, true},
		{"another network", fixture(t, "10-flannel.conflist"), single, false},
		{"same name, more plugins", []byte(`{"name":"cilium","plugins":[{"type":"cilium-cni"},{"type":"portmap"}]}`), single, false},
		{"same name, other type", []byte(`{"name":"cilium","plugins":[{"type":"bridge"}]}`), single, false},
		{"not JSON", fixture(t, "broken.conflist"), single, false},
	} {
		if got := EarlierConversion(tc.list, tc.single); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func FuzzChain(f *testing.F) {
	for _, n := range []string{"10-calico.conflist", "10-flannel.conflist", "05-cilium.conf", "broken.conflist"} {
		b, err := os.ReadFile(filepath.Join("testdata", n))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		e, err := Chain(in)
		if err != nil {
			return
		}
		if !json.Valid(e.Out) {
			t.Fatalf("Chain made invalid JSON of %q: %q", in, e.Out)
		}
		again, err := Chain(e.Out)
		if err != nil || again.Changed {
			t.Fatalf("Chain not idempotent on %q: %v %q", in, err, again.Out)
		}
		u, err := Unchain(e.Out)
		if err != nil || HasMarker(u.Out) {
			t.Fatalf("Unchain of %q: %v %q", e.Out, err, u.Out)
		}
		if !e.Converted && !HasMarker(in) && !bytes.Equal(u.Out, in) {
			t.Fatalf("Unchain(Chain(%q)) = %q", in, u.Out)
		}
	})
}

// TestChainProxyMetadata: the mesh-wide sidecar environment goes into the
// chained intercept entry, and a second run with other metadata replaces
// the entry.
func TestChainProxyMetadata(t *testing.T) {
	in := []byte(`{"name":"n","plugins":[{"type":"a"}]}`)
	meta := map[string]string{"ISTIO_META_DNS_CAPTURE": "true", "INVALID_DROP": "true"}
	e, err := ChainWith(in, ChainOptions{ProxyMetadata: meta})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(e.Out), `"proxyMetadata":{"INVALID_DROP":"true","ISTIO_META_DNS_CAPTURE":"true"},"meshwire.io/installed":true}`) {
		t.Fatalf("no proxyMetadata in the intercept entry:\n%s", e.Out)
	}
	if again, err := ChainWith(e.Out, ChainOptions{ProxyMetadata: meta}); err != nil || again.Changed {
		t.Fatalf("a second run with the same metadata changed the config (%v):\n%s", err, again.Out)
	}
	plain, err := Chain(e.Out)
	if err != nil || !plain.Changed || strings.Contains(string(plain.Out), "proxyMetadata") {
		t.Fatalf("a run without metadata kept it (%v):\n%s", err, plain.Out)
	}
}
