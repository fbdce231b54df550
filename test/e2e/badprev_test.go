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
	{"address missing", `{"interfaces":[{"name":"eth0"}],"ips":[{"interface":0}]}`, "prevResult.ips[0].address"},
	{"interfaces not a list", `{"interfaces":{"name":"eth0"}}`, "prevResult.interfaces"},
}

// TestBadPrevResult runs every plugin binary, for ADD and CHECK at 1.1.0
// and 0.4.0, with each bad prevResult, beside a pod that an earlier ADD
// wired: the answer is code 7 naming the entry, never a panic or code 999,
// and the pod and the host are left exactly as they were (each compared
// with its snapshot right after the calls). DEL, which must always finish
// the job, drops such entries and succeeds: the pod's own DEL, run plugin
// by plugin with a bad prevResult, leaves the host as it was before the
// pod's ADD and the pod as it was made, compared right after those DELs,
// before the runtime's own DEL (with the good cached result) runs at
// cleanup; and every other plugin's DEL succeeds too.
func TestBadPrevResult(t *testing.T) {
	h := harness.New(t)
	nodeBaseline(t)
	h.CheckNoLeaks()
	t.Cleanup(func() { bridgeRemoveLinks("mwbad0") })
	ns := h.NewNS("bad")
	dataDir := t.TempDir()
	list := h.ConfList(`{"cniVersion":"1.1.0","name":"mwbad","plugins":[
		{"type":"bridge","bridge":"mwbad0","isGateway":true,"ipMasq":true,"ipam":{"type":"host-local","subnet":"198.18.61.0/24","dataDir":"` + dataDir + `"}},
		{"type":"portmap","capabilities":{"portMappings":true}},
		{"type":"bandwidth","capabilities":{"bandwidth":true}}]}`)
	caps := map[string]any{
		"portMappings": []map[string]any{{"hostPort": 18461, "containerPort": 80, "protocol": "tcp"}},
		"bandwidth":    map[string]any{"ingressRate": 10_000_000, "ingressBurst": 1_000_000},
	}
	// The bridge and the node's base chains outlive pods: made by a first
	// pod (another host port) before the host's snapshot.
	first := h.Attach(list, h.NewNS("bad"), "eth0", map[string]any{
		"portMappings": []map[string]any{{"hostPort": 18462, "containerPort": 80, "protocol": "tcp"}},
		"bandwidth":    caps["bandwidth"],
	})
	first.MustAdd()
	t.Cleanup(func() {
		if err := first.Del(); err != nil {
			t.Errorf("DEL of the first pod: %v", err)
		}
	})
	chaosSettled(t, "veth", "mwbad")
	dirs := []string{dataDir}
	unwired, err := harness.StableSnapshot(dirs...)
	if err != nil {
		t.Fatal(err)
	}
	fresh := chaosPodSnapshot(t, ns)
	a := h.Attach(list, ns, "eth0", caps)
	a.MustAdd()
	t.Cleanup(func() {
		if err := a.Del(); err != nil {
			t.Errorf("DEL: %v", err)
		}
	})
	chaosSettled(t, "veth", "mwbad")
	before, err := harness.StableSnapshot(dirs...)
	if err != nil {
		t.Fatal(err)
	}
	wired := chaosPodSnapshot(t, ns)
	// judge compares the host and the pod with their snapshots, now.
	judge := func(host, pod *harness.Snapshot, what string) {
		t.Helper()
		diff, err := host.HostDiff(dirs)
		if err != nil {
			t.Fatal(err)
		}
		if len(diff) > 0 {
			t.Fatalf("%s, the host differs from its snapshot:\n  %s", what, strings.Join(diff, "\n  "))
		}
		if diff, err = pod.NSDiff(ns); err != nil {
			t.Fatal(err)
		}
		if len(diff) > 0 {
			t.Fatalf("%s, the pod differs from its snapshot:\n  %s", what, strings.Join(diff, "\n  "))
		}
	}
	plugins := map[string]string{
		"bridge":     `"bridge":"mwbad0","ipMasq":true,"ipam":{"type":"host-local","subnet":"198.18.61.0/24","dataDir":"` + dataDir + `"}`,
		"veth":       `"ipMasq":true,"ipam":{"type":"host-local","subnet":"198.18.61.0/24","dataDir":"` + dataDir + `"}`,
		"loopback":   ``,
		"portmap":    `"runtimeConfig":{"portMappings":[{"hostPort":18461,"containerPort":80,"protocol":"tcp"}]}`,
		"bandwidth":  `"runtimeConfig":{"bandwidth":{"ingressRate":10000000,"ingressBurst":1000000}}`,
		"intercept":  `"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"sidecar.istio.io/status":"{}"}}`,
		"host-local": `"ipam":{"type":"host-local","subnet":"198.18.61.0/24","dataDir":"` + dataDir + `"}`,
	}
	conf := func(plugin, v, prev string) []byte {
		var m map[string]any
		if err := json.Unmarshal([]byte(prev), &m); err != nil {
			t.Fatal(err)
		}
		m["cniVersion"] = v
		pb, _ := json.Marshal(m)
		c := fmt.Sprintf(`{"cniVersion":%q,"name":"mwbad","type":%q,"prevResult":%s`, v, plugin, pb)
		if keys := plugins[plugin]; keys != "" {
			c += "," + keys
		}
		return []byte(c + "}")
	}
	env := func(cmd string) map[string]string {
		return map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": a.RT.ContainerID, "CNI_NETNS": ns.Path, "CNI_IFNAME": "eth0", "CNI_PATH": h.BinDir}
	}
	for plugin := range plugins {
		for _, v := range []string{"1.1.0", "0.4.0"} {
			for _, bad := range badPrevResults {
				for _, cmd := range []string{"ADD", "CHECK"} {
					t.Run(strings.Join([]string{plugin, v, bad.name, cmd}, "/"), func(t *testing.T) {
						r := h.Exec(plugin, env(cmd), conf(plugin, v, bad.prev))
						if r.ExitCode != 1 {
							t.Fatalf("exit %d, stdout %s, stderr %s", r.ExitCode, r.Stdout, r.Stderr)
						}
						r.WantCNIError(t, 7, bad.field)
					})
				}
			}
		}
	}
	judge(before, wired, "after the rejected calls")
	if err := a.Check(); err != nil {
		t.Fatalf("CHECK of the pod after the rejected calls: %v", err)
	}
	// The pod's DEL, in the runtime's order, each plugin given every bad
	// entry at once: it succeeds and leaves nothing, judged before the
	// runtime's DEL at cleanup could remove what it left.
	worst := `{"interfaces":[null,{"name":"eth0"}],"ips":[null,{"interface":1},{"address":"198.18.61.2/24","interface":1}],"routes":[null]}`
	for _, plugin := range []string{"bandwidth", "portmap", "bridge", "veth", "loopback", "intercept", "host-local"} {
		if r := h.Exec(plugin, env("DEL"), conf(plugin, "1.1.0", worst)); r.ExitCode != 0 {
			t.Fatalf("%s DEL with a bad prevResult: exit %d, stdout %s, stderr %s", plugin, r.ExitCode, r.Stdout, r.Stderr)
		}
	}
	judge(unwired, fresh, "after the pod's DEL with a bad prevResult")
	if n := harness.Reservations(t, dataDir, "mwbad"); n != 1 {
		t.Fatalf("%d addresses reserved after the DEL, want the first pod's alone", n)
	}
}
