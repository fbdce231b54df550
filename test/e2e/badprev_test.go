//go:build kernel

package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/test/harness"
)

// badPrevResults are prevResults that the CNI library decodes (or, for the
// older versions, converts) into entries no plugin can use. Each once made a
// plugin panic: bridge's DEL with ipMasq in a goroutine (exit 2 with a Go
// stack trace), the conversion from 0.4.0 on the main goroutine (code 999).
var badPrevResults = []struct {
	name, prev, field string
}{
	{"null interface", `{"interfaces":[null],"ips":[{"address":"198.18.61.2/24","interface":0}]}`, "prevResult.interfaces[0]"},
	{"null ip", `{"interfaces":[{"name":"eth0"}],"ips":[null]}`, "prevResult.ips[0]"},
	{"null route", `{"ips":[{"address":"198.18.61.2/24"}],"routes":[null]}`, "prevResult.routes[0]"},
	{"interface index out of range", `{"interfaces":[{"name":"eth0"}],"ips":[{"address":"198.18.61.2/24","interface":5}]}`, "prevResult.ips[0].interface"},
	{"negative interface index", `{"interfaces":[{"name":"eth0"}],"ips":[{"address":"198.18.61.2/24","interface":-1}]}`, "prevResult.ips[0].interface"},
	{"address missing", `{"interfaces":[{"name":"eth0"}],"ips":[{"interface":0}]}`, "prevResult.ips[0].address"},
	{"interfaces not a list", `{"interfaces":{"name":"eth0"}}`, "prevResult.interfaces"},
}

// TestBadPrevResult runs every plugin binary, for ADD, CHECK and DEL at
// 1.1.0 and 0.4.0, with each bad prevResult, beside a pod that an earlier
// ADD wired: the answer is code 7 naming the entry, never a panic or code
// 999, and the pod and the host are left exactly as they were (the real
// DEL at the end then removes everything).
func TestBadPrevResult(t *testing.T) {
	h := harness.New(t)
	nodeBaseline(t)
	h.CheckNoLeaks()
	t.Cleanup(func() { bridgeRemoveLinks("mwbad0") })
	ns := h.NewNS("bad")
	list := h.ConfList(`{"cniVersion":"1.1.0","name":"mwbad","plugins":[
		{"type":"bridge","bridge":"mwbad0","isGateway":true,"ipMasq":true,"ipam":{"type":"host-local","subnet":"198.18.61.0/24","dataDir":"` + t.TempDir() + `"}},
		{"type":"portmap","capabilities":{"portMappings":true}},
		{"type":"bandwidth","capabilities":{"bandwidth":true}}]}`)
	a := h.Attach(list, ns, "eth0", map[string]any{
		"portMappings": []map[string]any{{"hostPort": 18461, "containerPort": 80, "protocol": "tcp"}},
		"bandwidth":    map[string]any{"ingressRate": 10_000_000, "ingressBurst": 1_000_000},
	})
	a.MustAdd()
	t.Cleanup(func() {
		if err := a.Del(); err != nil {
			t.Errorf("DEL: %v", err)
		}
	})
	before, err := harness.TakeSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	plugins := map[string]string{
		"bridge":     `"bridge":"mwbad0","ipMasq":true,"ipam":{"type":"host-local","subnet":"198.18.61.0/24"}`,
		"veth":       `"ipMasq":true,"ipam":{"type":"host-local","subnet":"198.18.61.0/24"}`,
		"loopback":   ``,
		"portmap":    `"runtimeConfig":{"portMappings":[{"hostPort":18462,"containerPort":80,"protocol":"tcp"}]}`,
		"bandwidth":  `"runtimeConfig":{"bandwidth":{"ingressRate":1000000,"ingressBurst":100000}}`,
		"intercept":  `"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"sidecar.istio.io/status":"{}"}}`,
		"host-local": `"ipam":{"type":"host-local","subnet":"198.18.61.0/24"}`,
	}
	for plugin, keys := range plugins {
		for _, v := range []string{"1.1.0", "0.4.0"} {
			for _, bad := range badPrevResults {
				for _, cmd := range []string{"ADD", "CHECK", "DEL"} {
					var prev map[string]any
					if err := json.Unmarshal([]byte(bad.prev), &prev); err != nil {
						t.Fatal(err)
					}
					prev["cniVersion"] = v
					pb, _ := json.Marshal(prev)
					conf := fmt.Sprintf(`{"cniVersion":%q,"name":"mwbad","type":%q,"prevResult":%s`, v, plugin, pb)
					if keys != "" {
						conf += "," + keys
					}
					conf += "}"
					env := map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": a.RT.ContainerID, "CNI_NETNS": ns.Path, "CNI_IFNAME": "eth0", "CNI_PATH": h.BinDir}
					t.Run(strings.Join([]string{plugin, v, bad.name, cmd}, "/"), func(t *testing.T) {
						r := h.Exec(plugin, env, []byte(conf))
						if r.ExitCode != 1 {
							t.Fatalf("exit %d, stdout %s, stderr %s", r.ExitCode, r.Stdout, r.Stderr)
						}
						r.WantCNIError(t, 7, bad.field)
					})
				}
			}
		}
	}
	after, err := harness.TakeSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	if diff := before.Diff(after); len(diff) > 0 {
		t.Fatalf("a rejected call changed the host:\n  %s", strings.Join(diff, "\n  "))
	}
	if err := a.Check(); err != nil {
		t.Fatalf("CHECK of the pod after the rejected calls: %v", err)
	}
}
