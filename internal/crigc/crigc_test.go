package crigc

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/meshwire/meshwire/internal/crigc/crigctest"
	"github.com/meshwire/meshwire/internal/hostlocal/store"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podstate"
)

var (
	pluginOnce sync.Once
	pluginDir  string
	pluginErr  error
)

// plugins is a directory with meshwire's host-local (MESHWIRE_BIN_DIR's,
// or built once for the test binary).
func plugins(t *testing.T) string {
	t.Helper()
	pluginOnce.Do(func() {
		if d := os.Getenv("MESHWIRE_BIN_DIR"); d != "" {
			if _, err := os.Stat(filepath.Join(d, "host-local")); err == nil {
				pluginDir = d
				return
			}
		}
		dir, err := os.MkdirTemp("", "mwt-crigc-plugins-")
		if err != nil {
			pluginErr = err
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "host-local"), "github.com/meshwire/meshwire/plugins/ipam/host-local").CombinedOutput()
		if err != nil {
			pluginErr = fmt.Errorf("go build host-local: %v\n%s", err, out)
		}
		pluginDir = dir
	})
	if pluginErr != nil {
		t.Fatal(pluginErr)
	}
	return pluginDir
}

const testNetwork = "mwt-crigc"

// node is a node's stores in temp dirs: the runtime's cache, host-local's
// data dir, the pods' records; the network is host-local alone (ADD, DEL
// and GC need neither root nor a namespace).
type node struct {
	t        *testing.T
	cacheDir string
	dataDir  string
	state    nodelayout.Layout
	list     *libcni.NetworkConfigList
	cni      *libcni.CNIConfig
	path     []string
}

func newNode(t *testing.T) *node {
	n := &node{t: t, cacheDir: t.TempDir(), dataDir: t.TempDir(), state: nodelayout.Layout{Root: t.TempDir()}, path: []string{plugins(t)}}
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"host-local","ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"198.18.7.0/24"}]]}}]}`, testNetwork, n.dataDir)
	l, err := libcni.NetworkConfFromBytes([]byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	n.list = l
	n.cni = libcni.NewCNIConfigWithCacheDir(n.path, n.cacheDir, nil)
	return n
}

// add is a runtime's ADD of container id on eth0: an allocation and a
// cached result, both made now.
func (n *node) add(id string) {
	n.t.Helper()
	if _, err := n.cni.AddNetworkList(context.Background(), n.list, &libcni.RuntimeConf{ContainerID: id, NetNS: "/run/netns/mwt-crigc-none", IfName: "eth0"}); err != nil {
		n.t.Fatalf("ADD %s: %v", id, err)
	}
}

// reserve is an ADD under way: host-local has allocated, nothing cached.
func (n *node) reserve(id string, since time.Time) {
	n.t.Helper()
	s, err := store.Open(n.dataDir, testNetwork, time.Second)
	if err != nil {
		n.t.Fatal(err)
	}
	defer s.Close()
	err = s.Update(func(tx *store.Tx) error {
		for i := 200; i < 250; i++ {
			a := net.IPv4(198, 18, 7, byte(i)).To4()
			if !tx.Taken(a) {
				return tx.Reserve(store.Allocation{IP: a, Owner: store.Owner{ID: id, IfName: "eth0"}, Since: since})
			}
		}
		return fmt.Errorf("full")
	})
	if err != nil {
		n.t.Fatal(err)
	}
}

// age makes container id's attachment look made at since: its cached
// result's time and its allocation's.
func (n *node) age(id string, since time.Time) {
	n.t.Helper()
	_ = os.Chtimes(filepath.Join(n.cacheDir, "results", testNetwork+"-"+id+"-eth0"), since, since)
	s, err := store.Open(n.dataDir, testNetwork, time.Second)
	if err != nil {
		n.t.Fatal(err)
	}
	defer s.Close()
	err = s.Update(func(tx *store.Tx) error {
		held, err := tx.ReleaseOwner(store.Owner{ID: id, IfName: "eth0"})
		for _, a := range held {
			a.Since = since
			if err == nil {
				err = tx.Reserve(a)
			}
		}
		return err
	})
	if err != nil {
		n.t.Fatal(err)
	}
}

// holders is who holds an address in host-local's store.
func (n *node) holders() string {
	n.t.Helper()
	as, err := store.ReadAll(filepath.Join(n.dataDir, testNetwork, store.DBName), time.Second)
	if err != nil {
		n.t.Fatal(err)
	}
	var ids []string
	for _, a := range as {
		ids = append(ids, a.Owner.ID)
	}
	sort.Strings(ids)
	return strings.Join(ids, ",")
}

// cached is whose results the runtime's cache holds.
func (n *node) cached() string {
	n.t.Helper()
	as, err := n.cni.GetCachedAttachments("")
	if err != nil {
		n.t.Fatal(err)
	}
	var ids []string
	for _, a := range as {
		ids = append(ids, a.ContainerID)
	}
	sort.Strings(ids)
	return strings.Join(ids, ",")
}

func (n *node) options(sock string, minAge time.Duration) Options {
	return Options{CRISocket: sock, MinAge: minAge, Networks: []*libcni.NetworkConfigList{n.list}, CNIPath: n.path, CacheDir: n.cacheDir, NodeState: n.state, Timeout: 5 * time.Second}
}

// The age rule: an attachment younger than min-age survives whether the
// runtime lists it or not (its ADD done but not listed yet, or still
// under way: an allocation alone); an older one not in the list is
// collected (its cached DEL, or host-local's GC when nothing is cached);
// one in the list survives whatever its age.
func TestRunAgeRule(t *testing.T) {
	n := newNode(t)
	long := time.Now().Add(-time.Hour)
	for _, id := range []string{"listed", "lost", "young"} {
		n.add(id)
	}
	n.age("listed", long)
	n.age("lost", long)
	n.reserve("inflight", time.Now()) // an ADD under way: allocated, not cached
	n.reserve("orphan", long)         // an old allocation whose cache is gone
	// A pod's record made just now, of an attachment no other store has
	// yet: valid for its age.
	if err := podstate.New(n.state).Put(podstate.Record{ContainerID: "recorded", IfName: "eth0", Network: testNetwork, Namespace: "ns", Name: "recorded"}); err != nil {
		t.Fatal(err)
	}
	if got := n.holders(); got != "inflight,listed,lost,orphan,young" {
		t.Fatalf("before: %s", got)
	}
	cri := &crigctest.Runtime{IDs: []string{"listed", "other-sandbox"}}
	sock := crigctest.Serve(t, cri)
	r, err := Run(context.Background(), n.options(sock, 2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if asked := cri.AskedAt(); len(asked) != 1 || r.ListedAt.After(asked[0]) {
		t.Errorf("listing time %v, the runtime was asked at %v: the time must be taken before the listing", r.ListedAt, asked)
	}
	if got := n.holders(); got != "inflight,listed,young" {
		t.Errorf("after the GC host-local holds addresses for %s, want inflight,listed,young", got)
	}
	if got := n.cached(); got != "listed,young" {
		t.Errorf("after the GC the cache holds %s, want listed,young", got)
	}
	nr := r.Networks[0]
	var valid, young, deleted []string
	for _, a := range nr.Valid {
		valid = append(valid, a.ContainerID+"/"+a.IfName)
	}
	for _, s := range nr.Young {
		young = append(young, s.ContainerID+" "+s.Where)
	}
	for _, s := range nr.Deleted {
		deleted = append(deleted, s.ContainerID)
	}
	sort.Strings(young)
	for what, got := range map[string][]string{
		"valid":   {strings.Join(valid, " "), "inflight/eth0 listed/eth0 other-sandbox/eth0 recorded/eth0 young/eth0"},
		"young":   {strings.Join(young, ","), "inflight host-local,recorded pod record,young cache"},
		"deleted": {strings.Join(deleted, ","), "lost"},
	} {
		if got[0] != got[1] {
			t.Errorf("%s: %s, want %s", what, got[0], got[1])
		}
	}
	if !nr.PluginGC {
		t.Error("the plugins' GC did not run on a 1.1.0 conflist")
	}
	var out strings.Builder
	r.Write(&out, 2*time.Minute)
	if !strings.Contains(out.String(), "listed 2 pod sandboxes") || !strings.Contains(out.String(), "1 stale cached attachments deleted (lost eth0)") {
		t.Errorf("report:\n%s", out.String())
	}

	// Once they are old, the ones the runtime never listed go too.
	n.age("young", long)
	n.reserve("later", time.Now())
	if _, err := Run(context.Background(), n.options(sock, 2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := n.holders(); got != "inflight,later,listed" {
		t.Errorf("after the second GC host-local holds addresses for %s, want inflight,later,listed", got)
	}
	// min-age 0 keeps nothing for its age: what is not listed goes (the
	// deliberate break the cluster suite shows).
	if _, err := Run(context.Background(), n.options(sock, 0)); err != nil {
		t.Fatal(err)
	}
	if got := n.holders(); got != "listed" {
		t.Errorf("with min-age 0 host-local holds addresses for %s, want listed alone", got)
	}
}

// A conflist with "disableGC" is left alone, as a runtime must.
func TestRunDisableGC(t *testing.T) {
	n := newNode(t)
	n.add("lost")
	n.age("lost", time.Now().Add(-time.Hour))
	n.list.DisableGC = true
	r, err := Run(context.Background(), n.options(crigctest.Serve(t, &crigctest.Runtime{}), time.Minute))
	if err != nil || !r.Networks[0].Disabled {
		t.Fatalf("%+v, %v", r, err)
	}
	if got := n.holders() + " " + n.cached(); got != "lost lost" {
		t.Errorf("a disableGC network was collected: %s", got)
	}
}

// Errors come before any change: a socket that is not one, a runtime
// that does not answer or fails the listing, a plugin not on the path,
// a negative min-age.
func TestRunErrorsChangeNothing(t *testing.T) {
	n := newNode(t)
	n.add("lost")
	n.age("lost", time.Now().Add(-time.Hour))
	notSock := filepath.Join(t.TempDir(), "plain")
	_ = os.WriteFile(notSock, nil, 0o600)
	dead := filepath.Join(t.TempDir(), "dead.sock") // a socket no one serves
	l, err := net.Listen("unix", dead)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	failing := crigctest.Serve(t, &crigctest.Runtime{ListFail: fmt.Errorf("runtime not ready")})
	good := crigctest.Serve(t, &crigctest.Runtime{})
	badPath := n.options(good, time.Minute)
	badPath.CNIPath = []string{t.TempDir()}
	for name, tc := range map[string]struct {
		o    Options
		want string
	}{
		"no socket":      {n.options(filepath.Join(t.TempDir(), "none.sock"), time.Minute), "no such file"},
		"not a socket":   {n.options(notSock, time.Minute), "is not a socket"},
		"no server":      {n.options(dead, time.Minute), "list the pod sandboxes over CRI"},
		"listing fails":  {n.options(failing, time.Minute), "runtime not ready"},
		"no plugin":      {badPath, "plugin host-local"},
		"negative age":   {n.options(good, -time.Second), "min-age is negative"},
		"no network":     {Options{CRISocket: good}, "no network"},
		"unix:// prefix": {n.options("unix://"+notSock, time.Minute), "is not a socket"},
	} {
		_, err := Run(context.Background(), tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
		if got := n.holders() + " " + n.cached(); got != "lost lost" {
			t.Errorf("%s: the stores changed: %s", name, got)
		}
	}
}

// Network picks the conflist as containerd does: the first of the
// directory by name; a single plugin's .conf becomes a list.
func TestNetwork(t *testing.T) {
	dir := t.TempDir()
	_ = os.WriteFile(filepath.Join(dir, "10-b.conflist"), []byte(`{"cniVersion":"1.1.0","name":"b","plugins":[{"type":"bridge"}]}`), 0o600)
	_ = os.WriteFile(filepath.Join(dir, "05-a.conf"), []byte(`{"cniVersion":"1.0.0","name":"a","type":"bridge"}`), 0o600)
	_ = os.WriteFile(filepath.Join(dir, "README"), []byte(`not a config`), 0o600)
	l, path, err := Network(dir, "")
	if err != nil || l.Name != "a" || len(l.Plugins) != 1 || filepath.Base(path) != "05-a.conf" {
		t.Fatalf("first of the directory: %v %s %v", l, path, err)
	}
	l, _, err = Network("", filepath.Join(dir, "10-b.conflist"))
	if err != nil || l.Name != "b" {
		t.Fatalf("named: %v %v", l, err)
	}
	if _, _, err := Network(t.TempDir(), ""); err == nil || !strings.Contains(err.Error(), "no network config") {
		t.Fatalf("empty directory: %v", err)
	}
}
