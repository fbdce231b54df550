//go:build kernel

package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/meshwire/meshwire/internal/installer"
	"github.com/meshwire/meshwire/internal/logging"
	"github.com/meshwire/meshwire/internal/poll"
	"github.com/meshwire/meshwire/test/harness"
)

// installFixture reads one of the installer's fixtures (configs as calico,
// flannel and cilium write them).
func installFixture(t *testing.T, name string) []byte {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "internal/installer/testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// syncBuffer is what a running command writes while the test reads it.
type syncBuffer = logging.Buffer

// waitUntil waits for cond for up to limit.
func waitUntil(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := poll.Until(limit, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestInstallWatch runs the built `meshwire install` as its DaemonSet
// does: it installs the plugins, chains intercept into the calico config,
// puts it back within seconds each time calico's installer rewrites the
// file (in place, or a new file renamed over it), and on SIGTERM with
// --cleanup-on-exit restores the original file, keeps the binaries and
// exits 0.
func TestInstallWatch(t *testing.T) {
	bin := harness.BinDir(t)
	binDir, confDir := t.TempDir(), t.TempDir()
	orig := installFixture(t, "10-calico.conflist")
	conf := filepath.Join(confDir, "10-calico.conflist")
	if err := os.WriteFile(conf, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd := exec.Command(filepath.Join(bin, "meshwire"), "install", "--cni-bin-dir", binDir, "--cni-conf-dir", confDir, "--chain", "--cleanup-on-exit")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	chained := func() bool {
		b, _ := os.ReadFile(conf)
		return installer.HasMarker(b)
	}
	waitUntil(t, 10*time.Second, "the first chaining", chained)

	// Every plugin (and ptp) installed, identical to the build's.
	for _, b := range installer.Binaries() {
		want, err := os.ReadFile(filepath.Join(bin, b.Source))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(binDir, b.Name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s not installed as %s: %v", b.Source, b.Name, err)
		}
	}
	for _, n := range []string{"meshwire", "iptables-init", "test"} {
		if _, err := os.Stat(filepath.Join(binDir, n)); err == nil {
			t.Fatalf("%s installed as a plugin", n)
		}
	}

	// calico's installer writes its config again, in place...
	if err := os.WriteFile(conf, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 5*time.Second, "chained again after a rewrite in place", chained)
	// ... or as a new file renamed over it.
	tmp := filepath.Join(confDir, "calico.tmp")
	if err := os.WriteFile(tmp, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, conf); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 5*time.Second, "chained again after a replacement", chained)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", waitErr, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("still running 10s after SIGTERM\n%s", stderr.String())
	}
	if got, _ := os.ReadFile(conf); !bytes.Equal(got, orig) {
		t.Fatalf("cleanup left\n%s\nwant the original\n%s", got, orig)
	}
	if _, err := os.Stat(filepath.Join(binDir, "intercept")); err != nil {
		t.Fatalf("cleanup removed the binaries: %v", err)
	}
	log := stderr.String()
	for _, want := range []string{"installed " + filepath.Join(binDir, "ptp"), "chained intercept into " + conf, "removed intercept from " + conf} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	t.Logf("log:\n%s", log)
}

// TestInstallOwnConflist: without --chain, meshwire's conflist is written,
// and SIGINT with --cleanup-on-exit removes it.
func TestInstallOwnConflist(t *testing.T) {
	bin := harness.BinDir(t)
	binDir, confDir := t.TempDir(), t.TempDir()
	cmd := exec.Command(filepath.Join(bin, "meshwire"), "install", "--cni-bin-dir", binDir, "--cni-conf-dir", confDir, "--cleanup-on-exit")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	own := filepath.Join(confDir, installer.OwnConflist)
	waitUntil(t, 10*time.Second, installer.OwnConflist+" written", func() bool { _, err := os.Stat(own); return err == nil })
	if _, err := libcni.ConfListFromFile(own); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGINT: %v\n%s", err, stderr.String())
	}
	if _, err := os.Stat(own); !os.IsNotExist(err) {
		t.Fatalf("%s left after cleanup: %v", own, err)
	}
}

// TestInstallOnceInvalid: --once with a primary config that is not JSON
// exits 1 naming the file, and leaves it alone.
func TestInstallOnceInvalid(t *testing.T) {
	bin := harness.BinDir(t)
	binDir, confDir := t.TempDir(), t.TempDir()
	broken := installFixture(t, "broken.conflist")
	conf := filepath.Join(confDir, "10-calico.conflist")
	os.WriteFile(conf, broken, 0o644)
	out, err := exec.Command(filepath.Join(bin, "meshwire"), "install", "--cni-bin-dir", binDir, "--cni-conf-dir", confDir, "--chain", "--once").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), conf+": not valid JSON") {
		t.Fatalf("exit %v, output:\n%s\nwant exit 1 naming %s", err, out, conf)
	}
	if got, _ := os.ReadFile(conf); !bytes.Equal(got, broken) {
		t.Fatal("the invalid file was changed")
	}
}

// TestInstallChainedPluginsRun: a config chained by the installer runs
// through libcni with the binaries it installed, the way containerd runs
// it for a Kubernetes pod: the plugins accept the installer's marker key,
// the intercept entry intercepts a pod with a sidecar, CHECK and DEL pass.
func TestInstallChainedPluginsRun(t *testing.T) {
	h := harness.New(t)
	nodeBaseline(t)
	h.CheckNoLeaks()
	binDir, confDir := t.TempDir(), t.TempDir()
	// A single-plugin .conf of the reference ptp (meshwire's veth,
	// installed under that name too).
	os.WriteFile(filepath.Join(confDir, "10-ptp.conf"), []byte(`{"cniVersion":"1.1.0","name":"mwt-inst","type":"ptp",
	  "ipam":{"type":"host-local","dataDir":"`+filepath.Join(t.TempDir(), "ipam")+`","ranges":[[{"subnet":"198.18.241.0/24"}]]}}`), 0o644)
	if out, err := exec.Command(filepath.Join(h.BinDir, "meshwire"), "install", "--cni-bin-dir", binDir, "--cni-conf-dir", confDir, "--chain", "--once").CombinedOutput(); err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	list, err := libcni.ConfListFromFile(filepath.Join(confDir, "10-ptp.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, p := range list.Plugins {
		types = append(types, p.Network.Type)
	}
	if strings.Join(types, " ") != "ptp portmap bandwidth intercept" {
		t.Fatalf("chained plugins: %q", types)
	}

	cni := libcni.NewCNIConfigWithCacheDir([]string{binDir}, t.TempDir(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cni.GetStatusNetworkList(ctx, list); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
	ns := h.NewNS("inst")
	rt := &libcni.RuntimeConf{
		ContainerID: harness.RandomID(), NetNS: ns.Path, IfName: "eth0",
		CapabilityArgs: map[string]any{"io.kubernetes.cri.pod-annotations": map[string]string{"sidecar.istio.io/status": `{"containers":["istio-proxy"]}`}},
	}
	rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "shop"}, {"K8S_POD_NAME", "p1"}, {"K8S_POD_INFRA_CONTAINER_ID", rt.ContainerID}}
	t.Cleanup(func() { _ = cni.DelNetworkList(context.Background(), list, rt) })
	if _, err := cni.AddNetworkList(ctx, list, rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	rules := func() string {
		nft, _ := ns.Exec("nft", "list", "ruleset")
		legacy, _ := ns.Exec("iptables-legacy-save")
		return nft + legacy
	}
	if r := rules(); !strings.Contains(r, "15001") || !strings.Contains(r, "15006") {
		t.Fatalf("no interception rules in the pod with a sidecar:\n%s", r)
	}
	if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if err := cni.DelNetworkList(ctx, list, rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if r := rules(); strings.Contains(r, "15001") {
		t.Fatalf("DEL left rules:\n%s", r)
	}
}

// TestInstallFastpath: --fastpath attaches the fast path when the installer
// starts and, with --cleanup-on-exit, detaches it on SIGTERM; a fast path
// attached before the installer started is left attached.
func TestInstallFastpath(t *testing.T) {
	h := harness.New(t)
	if st := fastpathStatus(t, h); st.Attached {
		t.Fatalf("the fast path is attached before the test (%s)", st.PinDir)
	}
	run := func(t *testing.T) (stop func() string) {
		binDir, confDir := t.TempDir(), t.TempDir()
		os.WriteFile(filepath.Join(confDir, "10-flannel.conflist"), installFixture(t, "10-flannel.conflist"), 0o644)
		cmd := exec.Command(filepath.Join(h.BinDir, "meshwire"), "install", "--cni-bin-dir", binDir, "--cni-conf-dir", confDir, "--chain", "--cleanup-on-exit", "--fastpath")
		var stderr syncBuffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		waitUntil(t, 10*time.Second, "the config chained", func() bool { return strings.Contains(stderr.String(), "chained") })
		return func() string {
			cmd.Process.Signal(syscall.SIGTERM)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("exit after SIGTERM: %v\n%s", err, stderr.String())
			}
			return stderr.String()
		}
	}

	t.Run("attached by the installer", func(t *testing.T) {
		t.Cleanup(func() { fastpathDetach(t, h) })
		stop := run(t)
		if st := fastpathStatus(t, h); !st.Attached || st.ProxyUID != 1337 || st.OutboundPort != 15001 {
			t.Fatalf("after start: %+v", st)
		}
		log := stop()
		if st := fastpathStatus(t, h); st.Attached {
			t.Fatalf("still attached after SIGTERM with --cleanup-on-exit:\n%s", log)
		}
		if !strings.Contains(log, "attached the fast path") || !strings.Contains(log, "detached the fast path") {
			t.Fatalf("log:\n%s", log)
		}
	})
	t.Run("attached before", func(t *testing.T) {
		fastpathAttach(t, h)
		log := run(t)()
		if st := fastpathStatus(t, h); !st.Attached {
			t.Fatalf("the installer detached a fast path it did not attach:\n%s", log)
		}
	})
}
