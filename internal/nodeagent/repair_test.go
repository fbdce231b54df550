package nodeagent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/logging/logtest"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podstate"
)

// fakePlugin answers the agent's calls from a table keyed by container id
// and command, and records them.
type fakePlugin struct {
	answers map[string]error // "id CMD" -> answer
	calls   []string
	envs    [][]string
	during  map[string]func() // "id CMD" -> what else happens during the call
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
	if do := f.during[id+" "+cmd]; do != nil {
		do()
	}
	return nil, f.answers[id+" "+cmd]
}

// standInNetns is a file that stands for a pod's network namespace, with
// its identity as the pod's record keeps it.
func standInNetns(t *testing.T) (path string, ino, dev uint64) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "netns")
	if err := writeFile(path); err != nil {
		t.Fatal(err)
	}
	ino, dev, err := netns.Identify(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, ino, dev
}

// TestRepairerRepeatsADDOnDriftOnly: CHECK's "check failed" (the pod's
// rules gone) is repaired by the same ADD, marked as a repair; a pod that
// is well and one whose CHECK fails otherwise (a config refused) get no
// ADD; one whose namespace is gone, whose path leads to another namespace
// than at ADD, or to the agent's own, is not even checked.
func TestRepairerRepeatsADDOnDriftOnly(t *testing.T) {
	store := podstate.New(nodelayout.At(t.TempDir()))
	nsPath, ino, dev := standInNetns(t)
	self, selfDev, err := netns.Identify("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	call := &podstate.Call{Config: []byte(`{}`)}
	for _, c := range []podstate.Record{
		{ContainerID: "drifted", Netns: nsPath, IfName: "eth0", Call: call, NetnsIno: ino, NetnsDev: dev},
		{ContainerID: "well", Netns: nsPath, IfName: "eth0", Call: call, NetnsIno: ino, NetnsDev: dev},
		{ContainerID: "refused", Netns: nsPath, IfName: "eth0", Call: call, NetnsIno: ino, NetnsDev: dev},
		{ContainerID: "gone", Netns: nsPath + "-gone", IfName: "eth0", Call: call, NetnsIno: ino, NetnsDev: dev},
		{ContainerID: "reused", Netns: nsPath, IfName: "eth0", Call: call, NetnsIno: ino + 1, NetnsDev: dev},
		{ContainerID: "host", Netns: "/proc/self/ns/net", IfName: "eth0", Call: call, NetnsIno: self, NetnsDev: selfDev},
		// Not meshed by the plugin (an ambient pod's record): not checked.
		{ContainerID: "ambient", Netns: nsPath, IfName: "eth0", NetnsIno: ino, NetnsDev: dev, Namespace: "shop", Name: "web"},
	} {
		if err := store.Put(c); err != nil {
			t.Fatal(err)
		}
	}
	fp := &fakePlugin{answers: map[string]error{
		"drifted CHECK": cnierr.CheckFailed("interception rules are missing in %s", nsPath),
		"refused CHECK": cnierr.Field("istio-inbound-ports", "bad"),
	}}
	log := logtest.Capture(t)
	r := &Repairer{BinDir: "/opt/cni/bin", Store: store, exec: fp}
	if err := r.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	slices.Sort(fp.calls)
	if want := []string{"drifted ADD", "drifted CHECK", "refused CHECK", "well CHECK"}; !slices.Equal(fp.calls, want) {
		t.Fatalf("calls %q, want %q", fp.calls, want)
	}
	for i, env := range fp.envs {
		if slices.Contains(env, "CNI_COMMAND=ADD") != slices.Contains(env, nodelayout.EnvRepair+"=1") {
			t.Fatalf("call %d: the ADD, and only it, is marked a repair: %q", i, env)
		}
		if !slices.Contains(env, nodelayout.EnvNodeStateDir+"="+store.Layout.Root) {
			t.Fatalf("call %d: the plugin is not told where the records are: %q", i, env)
		}
	}
	if st := r.Stats(); st != (RepairStats{Pods: 6, Rounds: 1, Repairs: 1, Errors: 1}) {
		t.Fatalf("stats %+v", st)
	}
	// A failure is logged once while it lasts.
	before := log.String()
	if err := r.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimPrefix(log.String(), before); strings.Count(got, "\n") != 1 || !strings.Contains(got, "repaired") { // the second repair only
		t.Fatalf("the second round logged %q, want the repair only", got)
	}
}

// TestRepairerDELFirst: a pod whose DEL comes between the agent's CHECK
// and its repair ADD (the plugin's repair then finds the record gone and
// does nothing) is not counted or logged as repaired.
func TestRepairerDELFirst(t *testing.T) {
	store := podstate.New(nodelayout.At(t.TempDir()))
	nsPath, ino, dev := standInNetns(t)
	rec := podstate.Record{ContainerID: "leaving", Netns: nsPath, IfName: "eth0", Call: &podstate.Call{Config: []byte(`{}`)}, NetnsIno: ino, NetnsDev: dev}
	if err := store.Put(rec); err != nil {
		t.Fatal(err)
	}
	fp := &fakePlugin{
		answers: map[string]error{"leaving CHECK": cnierr.CheckFailed("interception rules are missing in %s", nsPath)},
		during: map[string]func(){"leaving ADD": func() {
			if err := store.Remove(podstate.Name("leaving", "eth0")); err != nil {
				t.Error(err)
			}
		}},
	}
	log := logtest.Capture(t)
	r := &Repairer{BinDir: "/opt/cni/bin", Store: store, exec: fp}
	if err := r.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Repairs != 0 || st.Failures != 0 {
		t.Errorf("stats %+v: the DEL's pod counted", st)
	}
	if got := log.String(); strings.Contains(got, "repaired the pod's interception") || !strings.Contains(got, "nothing repaired") {
		t.Errorf("the log: %q", got)
	}
}

// TestNoRepairBeforeInstall: the agent checks no pod before its installer
// has put this build's plugins into the CNI binary directory, which until
// then holds what was there (the earlier build's plugins, on a node
// upgraded in place); once they are installed, the next tick checks the
// pods.
func TestNoRepairBeforeInstall(t *testing.T) {
	a, _ := testAgent(t, true, "127.0.0.1:0")
	nsPath, ino, dev := standInNetns(t)
	rec := podstate.Record{ContainerID: "meshed", Netns: nsPath, IfName: "eth0", Call: &podstate.Call{Config: []byte(`{}`)}, NetnsIno: ino, NetnsDev: dev}
	if err := a.store.Put(rec); err != nil {
		t.Fatal(err)
	}
	fp := &fakePlugin{}
	a.rep.exec = fp
	a.repairCtx = context.Background()
	a.tick()
	a.repairs.Wait()
	if len(fp.calls) > 0 {
		t.Fatalf("the agent ran %q before its plugins were installed", fp.calls)
	}
	if err := a.in.InstallBinaries(); err != nil {
		t.Fatal(err)
	}
	a.tick()
	a.repairs.Wait()
	if want := []string{"meshed CHECK"}; !slices.Equal(fp.calls, want) {
		t.Fatalf("calls once installed %q, want %q", fp.calls, want)
	}
}

func writeFile(p string) error { return os.WriteFile(p, nil, 0o600) }
