package installer

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/meshwire/meshwire/internal/logging"
	"github.com/meshwire/meshwire/internal/logging/logtest"
	"github.com/meshwire/meshwire/internal/poll"
)

// node is a fake node: a source directory with the built files, and the
// CNI binary and config directories.
type node struct {
	t                    *testing.T
	src, bin, conf       string
	log                  *logging.Buffer
	chain, cleanupOnExit bool
}

func newNode(t *testing.T, chain bool, confs ...string) *node {
	n := &node{t: t, src: t.TempDir(), bin: t.TempDir(), conf: t.TempDir(), log: logtest.Capture(t), chain: chain}
	// What `make build` leaves in bin/: plugins, commands, test programs.
	for _, name := range append(append([]string{}, pluginNames...), "meshwire", "iptables-init") {
		if err := os.WriteFile(filepath.Join(n.src, name), []byte("#!/bin/sh\necho "+name+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(n.src, "test"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range confs {
		n.put(c, fixture(t, c))
	}
	return n
}

func (n *node) options() Options {
	return Options{BinDir: n.bin, ConfDir: n.conf, SourceDir: n.src, Chain: n.chain, Once: true,
		CleanupOnExit: n.cleanupOnExit, DefaultConflist: []byte(`{"cniVersion":"1.1.0","name":"meshwire","plugins":[{"type":"bridge"}]}`),
		Resync: time.Second}
}

func (n *node) installer() *Installer {
	in, err := New(n.options())
	if err != nil {
		n.t.Fatal(err)
	}
	return in
}

func (n *node) put(name string, data []byte) {
	n.t.Helper()
	if err := os.WriteFile(filepath.Join(n.conf, name), data, 0o644); err != nil {
		n.t.Fatal(err)
	}
}

func (n *node) read(name string) []byte {
	n.t.Helper()
	b, err := os.ReadFile(filepath.Join(n.conf, name))
	if err != nil {
		n.t.Fatal(err)
	}
	return b
}

func (n *node) names() []string {
	ents, err := os.ReadDir(n.conf)
	if err != nil {
		n.t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func TestInstallBinaries(t *testing.T) {
	n := newNode(t, true)
	in := n.installer()
	if err := in.InstallBinaries(); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(n.bin)
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if want := "bandwidth bridge host-local intercept loopback portmap ptp veth"; strings.Join(got, " ") != want {
		t.Fatalf("installed %q, want %q", got, want)
	}
	if ptp, _ := os.ReadFile(filepath.Join(n.bin, "ptp")); string(ptp) != "#!/bin/sh\necho veth\n" {
		t.Fatalf("ptp is not veth: %q", ptp)
	}
	before := n.log.String()
	if err := in.InstallBinaries(); err != nil {
		t.Fatal(err)
	}
	if after := strings.TrimPrefix(n.log.String(), before); strings.Contains(after, "installed") || !strings.Contains(after, "8 plugins") {
		t.Fatalf("second install logged %q", after)
	}
	if in.binariesTouched() {
		t.Fatal("binaries touched right after install")
	}
	os.WriteFile(filepath.Join(n.bin, "portmap"), []byte("another installer's portmap"), 0o755)
	if !in.binariesTouched() {
		t.Fatal("a replaced binary went unnoticed")
	}

	os.Remove(filepath.Join(n.src, "intercept"))
	if err := in.InstallBinaries(); err == nil || !strings.Contains(err.Error(), filepath.Join(n.src, "intercept")) {
		t.Fatalf("missing source plugin: %v", err)
	}
}

func TestApplyChain(t *testing.T) {
	for _, tc := range []struct {
		confs   []string
		primary string // the file chained into, after the run
		gone    string // the file converted away
	}{
		{[]string{"10-calico.conflist", "calico-kubeconfig"}, "10-calico.conflist", ""},
		{[]string{"10-flannel.conflist"}, "10-flannel.conflist", ""},
		{[]string{"05-cilium.conf", "10-flannel.conflist"}, "05-cilium.conflist", "05-cilium.conf"},
	} {
		t.Run(tc.confs[0], func(t *testing.T) {
			n := newNode(t, true, tc.confs...)
			in := n.installer()
			if err := in.Apply(); err != nil {
				t.Fatal(err)
			}
			got := n.read(tc.primary)
			want, _ := Chain(fixture(t, tc.confs[0]))
			if !bytes.Equal(got, want.Out) {
				t.Fatalf("%s:\n%s\nwant\n%s", tc.primary, got, want.Out)
			}
			if tc.gone != "" {
				if _, err := os.Stat(filepath.Join(n.conf, tc.gone)); !os.IsNotExist(err) {
					t.Fatalf("%s still there after the conversion: %v", tc.gone, err)
				}
			}
			for _, other := range tc.confs[1:] {
				if !bytes.Equal(n.read(other), fixture(t, other)) {
					t.Fatalf("%s changed", other)
				}
			}
			if Primary(n.names()) != tc.primary {
				t.Fatalf("primary is now %s", Primary(n.names()))
			}
			// A second run changes nothing.
			ino, log := inode(t, filepath.Join(n.conf, tc.primary)), n.log.String()
			if err := in.Apply(); err != nil {
				t.Fatal(err)
			}
			if inode(t, filepath.Join(n.conf, tc.primary)) != ino || n.log.String() != log {
				t.Fatalf("second run rewrote or logged: %s", strings.TrimPrefix(n.log.String(), log))
			}
			if err := in.Cleanup(); err != nil {
				t.Fatal(err)
			}
			back := n.read(tc.primary)
			if tc.gone == "" {
				if !bytes.Equal(back, fixture(t, tc.confs[0])) {
					t.Fatalf("cleanup left\n%s", back)
				}
			} else if HasMarker(back) || len(rawPlugins(t, back)) != 1 {
				t.Fatalf("cleanup left\n%s", back)
			}
			t.Logf("log:\n%s", n.log)
		})
	}
}

// TestApplyChainConvertAgain: cilium writes its .conf again (agent restart)
// over meshwire's earlier conversion, chained or left by cleanup; it is
// converted again. A .conflist of another network under that name stops the
// conversion.
func TestApplyChainConvertAgain(t *testing.T) {
	n := newNode(t, true, "05-cilium.conf")
	in := n.installer()
	if err := in.Apply(); err != nil {
		t.Fatal(err)
	}
	rewritten := []byte(`{"cniVersion":"1.0.0","name":"cilium","type":"cilium-cni","enable-debug":true}`)
	n.put("05-cilium.conf", rewritten)
	if err := in.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := n.names(); strings.Join(got, " ") != "05-cilium.conflist" {
		t.Fatalf("files: %q", got)
	}
	if ps := rawPlugins(t, n.read("05-cilium.conflist")); len(ps) != 4 || !bytes.Equal(ps[0], rewritten) {
		t.Fatalf("not the new config chained: %s", n.read("05-cilium.conflist"))
	}
	if err := in.Cleanup(); err != nil {
		t.Fatal(err)
	}
	n.put("05-cilium.conf", fixture(t, "05-cilium.conf"))
	if err := in.Apply(); err != nil {
		t.Fatalf("convert over the list cleanup left: %v", err)
	}

	other := []byte(`{"cniVersion":"0.3.1","name":"other","plugins":[{"type":"bridge"}]}`)
	n.put("05-cilium.conflist", other)
	n.put("05-cilium.conf", fixture(t, "05-cilium.conf"))
	err := in.Apply()
	if err == nil || !strings.Contains(err.Error(), "05-cilium.conf") || !strings.Contains(err.Error(), "another network") {
		t.Fatalf("conversion over another network's list: %v", err)
	}
	if !bytes.Equal(n.read("05-cilium.conflist"), other) || !bytes.Equal(n.read("05-cilium.conf"), fixture(t, "05-cilium.conf")) {
		t.Fatal("files changed after the refusal")
	}
}

func TestApplyChainInvalid(t *testing.T) {
	n := newNode(t, true)
	n.put("10-calico.conflist", fixture(t, "broken.conflist"))
	n.put("20-flannel.conflist", fixture(t, "10-flannel.conflist"))
	err := n.installer().Apply()
	if err == nil || !strings.Contains(err.Error(), filepath.Join(n.conf, "10-calico.conflist")) || !strings.Contains(err.Error(), "not valid JSON") {
		t.Fatalf("Apply: %v, want an error naming the file", err)
	}
	if !bytes.Equal(n.read("10-calico.conflist"), fixture(t, "broken.conflist")) || !bytes.Equal(n.read("20-flannel.conflist"), fixture(t, "10-flannel.conflist")) {
		t.Fatal("files changed")
	}
	// Run with Once returns the error.
	if err := run(context.Background(), n.options()); err == nil {
		t.Fatal("Run --once with an invalid primary config succeeded")
	}

	empty := newNode(t, true)
	if err := empty.installer().Apply(); err == nil || !strings.Contains(err.Error(), "no CNI config") {
		t.Fatalf("Apply in an empty directory: %v", err)
	}
}

func TestApplyOwn(t *testing.T) {
	n := newNode(t, false)
	in := n.installer()
	if err := in.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := n.read(OwnConflist); !bytes.Equal(got, n.options().DefaultConflist) {
		t.Fatalf("%s: %s", OwnConflist, got)
	}
	ino := inode(t, filepath.Join(n.conf, OwnConflist))
	if err := in.Apply(); err != nil || inode(t, filepath.Join(n.conf, OwnConflist)) != ino {
		t.Fatalf("second run: %v, rewritten %v", err, inode(t, filepath.Join(n.conf, OwnConflist)) != ino)
	}
	n.put("00-first.conflist", fixture(t, "10-flannel.conflist"))
	if err := in.Apply(); err != nil || !strings.Contains(n.log.String(), "00-first.conflist, which sorts before") {
		t.Fatalf("no warning about a file sorting first: %v\n%s", err, n.log)
	}
	if err := in.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got := n.names(); strings.Join(got, " ") != "00-first.conflist" {
		t.Fatalf("after cleanup: %q", got)
	}

	// A later run with --chain removes the file a run without it left.
	n.put(OwnConflist, n.options().DefaultConflist)
	n.chain = true
	if err := n.installer().Apply(); err != nil {
		t.Fatal(err)
	}
	if got := n.names(); strings.Join(got, " ") != "00-first.conflist" || !HasMarker(n.read("00-first.conflist")) {
		t.Fatalf("after a run with --chain: %q", got)
	}
}

// waitFor waits for cond for up to 5 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := poll.Until(5*time.Second, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestWatch runs the installer in watch mode: it chains the config, re-applies
// it when another installer rewrites (in place, or by renaming a new file
// over it), retries after an invalid file, and cleans up when stopped.
func TestWatch(t *testing.T) {
	n := newNode(t, true, "10-calico.conflist")
	o := n.options()
	o.Once, o.CleanupOnExit, o.Resync = false, true, time.Hour // events only
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, o) }()
	stopped := false
	defer func() {
		if !stopped {
			cancel()
			<-done
		}
	}()
	orig := fixture(t, "10-calico.conflist")
	chained := func() bool { b, _ := os.ReadFile(filepath.Join(n.conf, "10-calico.conflist")); return HasMarker(b) }
	waitFor(t, "the first chaining", chained)

	n.put("10-calico.conflist", orig) // in place
	waitFor(t, "chaining after a rewrite in place", chained)

	tmp := filepath.Join(n.conf, "10-calico.conflist.tmp")
	os.WriteFile(tmp, orig, 0o644)
	os.Rename(tmp, filepath.Join(n.conf, "10-calico.conflist")) // replaced
	waitFor(t, "chaining after a replacement", chained)

	n.put("10-calico.conflist", fixture(t, "broken.conflist"))
	waitFor(t, "the error logged", func() bool { return strings.Contains(n.log.String(), "not valid JSON") })
	n.put("10-calico.conflist", orig)
	waitFor(t, "chaining after an invalid file was fixed", chained)

	cancel()
	stopped = true
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := n.read("10-calico.conflist"); !bytes.Equal(got, orig) {
		t.Fatalf("after cleanup:\n%s", got)
	}
	t.Logf("log:\n%s", n.log)
}

// run is New and Run, as `meshwire install` does them.
func run(ctx context.Context, o Options) error {
	in, err := New(o)
	if err != nil {
		return err
	}
	return in.Run(ctx)
}

// TestPluginLog: with PluginLog, every entry meshwire chains, and every
// plugin of its own conflist, names the log file; a relative path is
// refused.
func TestPluginLog(t *testing.T) {
	const file = "/var/log/meshwire/cni.log"
	n := newNode(t, true, "10-flannel.conflist")
	o := n.options()
	o.PluginLog = file
	in, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Apply(); err != nil {
		t.Fatal(err)
	}
	var list struct {
		Plugins []map[string]json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(n.read("10-flannel.conflist"), &list); err != nil {
		t.Fatal(err)
	}
	logged := 0
	for _, p := range list.Plugins {
		_, marked := p[Marker]
		if string(p["log"]) == `{"file":"/var/log/meshwire/cni.log"}` {
			logged++
			if !marked {
				t.Errorf("a plugin meshwire did not add got the log: %s", p["type"])
			}
		} else if marked {
			t.Errorf("chained %s has no log object: %s", p["type"], p["log"])
		}
	}
	if logged != 2 { // flannel's config has a portmap of its own
		t.Fatalf("%d chained plugins with the log, want 2 (bandwidth, intercept)", logged)
	}

	own := newNode(t, false)
	o = own.options()
	o.DefaultConflist = []byte(`{"cniVersion":"1.1.0","name":"meshwire","plugins":[{"type":"bridge","mtu":1450},{"type":"portmap","log":{"file":"/tmp/own.log"}}]}`)
	o.PluginLog = file
	in, err = New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Apply(); err != nil {
		t.Fatal(err)
	}
	want := `{
  "cniVersion": "1.1.0",
  "name": "meshwire",
  "plugins": [
    {
      "log": {
        "file": "/var/log/meshwire/cni.log"
      },
      "mtu": 1450,
      "type": "bridge"
    },
    {
      "log": {
        "file": "/tmp/own.log"
      },
      "type": "portmap"
    }
  ]
}
`
	if got := string(own.read(OwnConflist)); got != want {
		t.Fatalf("own conflist:\n%s\nwant\n%s", got, want)
	}

	o.PluginLog = "cni.log"
	if _, err := New(o); err == nil || !strings.Contains(err.Error(), `"cni.log" is not an absolute path`) {
		t.Fatalf("relative plugin log: %v", err)
	}
}

// TestState: the state the node agent reports follows InstallBinaries and
// Apply, failures included.
func TestState(t *testing.T) {
	n := newNode(t, true)
	in := n.installer()
	if st := in.State(); st != (State{}) {
		t.Fatalf("before anything: %+v", st)
	}
	if err := in.InstallBinaries(); err != nil {
		t.Fatal(err)
	}
	if err := in.Apply(); err == nil {
		t.Fatal("Apply with no config succeeded")
	}
	if st := in.State(); !st.BinariesInstalled || st.Applied || st.Failures != 1 || st.Applies != 0 || !strings.Contains(st.LastError, "no CNI config") {
		t.Fatalf("after a failed Apply: %+v", st)
	}
	n.put("10-flannel.conflist", fixture(t, "10-flannel.conflist"))
	if err := in.Apply(); err != nil {
		t.Fatal(err)
	}
	if st := in.State(); !st.Applied || st.Applies != 1 || st.Failures != 1 || st.LastError != "" {
		t.Fatalf("after Apply: %+v", st)
	}
}

// TestKeepOnExit: with CleanupOnExit, a KeepOnExit that answers true (an
// update: the agent's DaemonSet stays) leaves the chained config in place;
// false takes it back.
func TestKeepOnExit(t *testing.T) {
	for _, keep := range []bool{true, false} {
		n := newNode(t, true, "10-calico.conflist")
		o := n.options()
		o.Once, o.CleanupOnExit, o.Resync = false, true, time.Hour
		asked := false
		o.KeepOnExit = func() bool { asked = true; return keep }
		in, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- in.Run(ctx) }()
		waitFor(t, "the chaining", func() bool { b, _ := os.ReadFile(filepath.Join(n.conf, "10-calico.conflist")); return HasMarker(b) })
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if chained := HasMarker(n.read("10-calico.conflist")); !asked || chained != keep {
			t.Errorf("keep %v: asked %v, still chained %v", keep, asked, chained)
		}
		if in.TookBack() == keep {
			t.Errorf("keep %v: TookBack says %v", keep, in.TookBack())
		}
	}
}
