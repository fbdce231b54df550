package nodeagent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/meshedpods"
	"github.com/meshwire/meshwire/internal/netns"
)

// fakePlugin answers the agent's calls from a table keyed by container id
// and command, and records them.
type fakePlugin struct {
	answers map[string]error // "id CMD" -> answer
	calls   []string
	envs    [][]string
}

func (f *fakePlugin) ExecPlugin(_ context.Context, path string, _ []byte, env []string) ([]byte, error) {
	var id, cmd string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "CNI_CONTAINERID="); ok {
			id = v
		}
		if v, ok := strings.CutPrefix(kv, "CNI_COMMAND="); ok {
			cmd = v
		}
	}
	if filepath.Base(path) != "intercept" {
		panic("not the intercept plugin: " + path)
	}
	f.calls = append(f.calls, id+" "+cmd)
	f.envs = append(f.envs, env)
	return nil, f.answers[id+" "+cmd]
}

// TestRepairerRepeatsADDOnDriftOnly: CHECK's "check failed" (the pod's
// rules gone) is repaired by the same ADD, marked as a repair; a pod that
// is well and one whose CHECK fails otherwise (a config refused) get no
// ADD; one whose namespace is gone, whose path leads to another namespace
// than at ADD, or to the agent's own, is not even checked.
func TestRepairerRepeatsADDOnDriftOnly(t *testing.T) {
	dir := t.TempDir()
	nsPath := filepath.Join(t.TempDir(), "netns")
	if err := writeFile(nsPath); err != nil {
		t.Fatal(err)
	}
	ino, dev, err := netns.Identify(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	self, selfDev, err := netns.Identify("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []meshedpods.Call{
		{ContainerID: "drifted", Netns: nsPath, IfName: "eth0", Config: []byte(`{}`), NetnsIno: ino, NetnsDev: dev},
		{ContainerID: "well", Netns: nsPath, IfName: "eth0", Config: []byte(`{}`), NetnsIno: ino, NetnsDev: dev},
		{ContainerID: "refused", Netns: nsPath, IfName: "eth0", Config: []byte(`{}`), NetnsIno: ino, NetnsDev: dev},
		{ContainerID: "gone", Netns: nsPath + "-gone", IfName: "eth0", Config: []byte(`{}`), NetnsIno: ino, NetnsDev: dev},
		{ContainerID: "reused", Netns: nsPath, IfName: "eth0", Config: []byte(`{}`), NetnsIno: ino + 1, NetnsDev: dev},
		{ContainerID: "host", Netns: "/proc/self/ns/net", IfName: "eth0", Config: []byte(`{}`), NetnsIno: self, NetnsDev: selfDev},
	} {
		if err := meshedpods.Write(dir, c); err != nil {
			t.Fatal(err)
		}
	}
	fp := &fakePlugin{answers: map[string]error{
		"drifted CHECK": cnierr.CheckFailed("interception rules are missing in %s", nsPath),
		"refused CHECK": cnierr.Field("istio-inbound-ports", "bad"),
	}}
	var logs []string
	r := &Repairer{BinDir: "/opt/cni/bin", Dir: dir, exec: fp, Logf: func(f string, a ...any) { logs = append(logs, f) }}
	if err := r.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	slices.Sort(fp.calls)
	if want := []string{"drifted ADD", "drifted CHECK", "refused CHECK", "well CHECK"}; !slices.Equal(fp.calls, want) {
		t.Fatalf("calls %q, want %q", fp.calls, want)
	}
	for i, env := range fp.envs {
		if slices.Contains(env, "CNI_COMMAND=ADD") != slices.Contains(env, meshedpods.EnvRepair+"=1") {
			t.Fatalf("call %d: the ADD, and only it, is marked a repair: %q", i, env)
		}
	}
	if st := r.Stats(); st != (RepairStats{Pods: 6, Repairs: 1, Errors: 1}) {
		t.Fatalf("stats %+v", st)
	}
	// A failure is logged once while it lasts.
	n := len(logs)
	if err := r.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := len(logs) - n; got != 1 { // the second repair only
		t.Fatalf("%d lines logged by the second round, want 1: %q", got, logs[n:])
	}
}

func writeFile(p string) error { return os.WriteFile(p, nil, 0o600) }
