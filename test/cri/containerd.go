// Package cri runs Debian's containerd 1.6 with its CRI plugin, the way a
// Kubernetes node does, on a socket and directories of its own, and drives
// it over the CRI gRPC API as kubelet does: pod sandboxes (whose network
// containerd sets up by running the CNI plugins of a conf_dir from a
// bin_dir), containers in them, exec, teardown.
//
// There is no registry: the one image (Image) is made from busybox-static
// with podman and imported with ctr. Everything is removed at test cleanup,
// also when the test fails: pods (through CRI, so that containerd runs the
// plugins' DEL), containerd and its shims, mounts, directories.
package cri

import (
	"bufio"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Tools the package runs (test/deps.sh installs them).
const (
	ContainerdBin = "/usr/bin/containerd"
	CtrBin        = "/usr/bin/ctr"
	// RuncBin is the OCI runtime: crun refuses the hybrid cgroup layout of
	// these machines.
	RuncBin = "/usr/sbin/runc"
)

// Bounds of the waits.
const (
	startTimeout = 30 * time.Second // containerd serving and CRI ready
	callTimeout  = 60 * time.Second // one CRI call (RunPodSandbox runs the plugins)
	stopTimeout  = 15 * time.Second // containerd exiting after SIGTERM
)

// Config is what a test chooses of containerd's CRI setup.
type Config struct {
	// BinDir is the CNI bin_dir: the built meshwire plugins.
	BinDir string
	// ConfList is written to the CNI conf_dir before containerd starts
	// (so that the first pod finds it); its name is Name.
	ConfList string
	// Name is the conflist's file name in the conf_dir ("10-test.conflist"
	// when empty).
	Name string
}

// Containerd is one running containerd.
type Containerd struct {
	T testing.TB
	// Dir holds everything of this containerd: root, state, sockets,
	// runc's state, the CNI conf_dir, logs.
	Dir     string
	Socket  string
	ConfDir string
	// LogPath is containerd's output (printed when the test fails).
	LogPath string
	Runtime runtimeapi.RuntimeServiceClient
	Images  runtimeapi.ImageServiceClient

	conn   *grpc.ClientConn
	cmd    *exec.Cmd
	exited chan struct{} // closed when containerd exits
	mu     sync.Mutex    // guards netns and ids: pods are run from many goroutines
	netns  map[string]bool
	ids    map[string]bool // of the sandboxes and containers created
	image  bool            // holds the image archive
	// cgroupParent is the pods' cgroup parent, of this containerd only
	// (runc removes a container's cgroup, not its parents).
	cgroupParent string
	// shimDirs are the directories the shims create for their sockets
	// (/run/containerd/s, whatever containerd's state) that did not exist
	// before: removed at cleanup when empty.
	shimDirs []string
}

// Start runs a containerd with its CRI plugin on a socket of its own, with
// Image imported, and returns when CRI reports the runtime and the network
// ready. Cleanup (registered on t) removes every pod, stops containerd and
// removes its directories, printing containerd's log when t failed.
func Start(t testing.TB, cfg Config) *Containerd {
	t.Helper()
	for _, tool := range []string{ContainerdBin, CtrBin, RuncBin, "podman", Busybox} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing (test/deps.sh installs it): %v", tool, err)
		}
	}
	// A short path: the socket's must stay under 108 bytes.
	dir, err := os.MkdirTemp("", "mwcri-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Containerd{
		T: t, Dir: dir,
		Socket:  filepath.Join(dir, "containerd.sock"),
		ConfDir: filepath.Join(dir, "net.d"),
		LogPath: filepath.Join(dir, "containerd.log"),
		netns:   map[string]bool{},
		ids:     map[string]bool{},

		cgroupParent: "/" + filepath.Base(dir),
	}
	for _, d := range []string{"/run/containerd", "/run/containerd/s"} {
		if _, err := os.Stat(d); os.IsNotExist(err) {
			c.shimDirs = append([]string{d}, c.shimDirs...)
		}
	}
	t.Cleanup(c.cleanup)

	if err := os.MkdirAll(c.ConfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if cfg.ConfList != "" {
		name := cfg.Name
		if name == "" {
			name = "10-test.conflist"
		}
		if err := os.WriteFile(filepath.Join(c.ConfDir, name), []byte(cfg.ConfList), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	text, err := c.config(cfg.BinDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	image, err := acquireImage()
	if err != nil {
		t.Fatalf("building the busybox image: %v", err)
	}
	c.image = true

	if err := c.startProcess(); err != nil {
		t.Fatalf("start containerd: %v", err)
	}

	c.conn, err = grpc.NewClient("unix://"+c.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc client: %v", err)
	}
	c.Runtime = runtimeapi.NewRuntimeServiceClient(c.conn)
	c.Images = runtimeapi.NewImageServiceClient(c.conn)
	if err := c.waitServing(); err != nil {
		t.Fatalf("containerd: %v", err)
	}
	if out, err := runBounded(exec.Command(CtrBin, "-a", c.Socket, "-n", "k8s.io", "images", "import", image), callTimeout); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	if err := c.waitReady(); err != nil {
		t.Fatalf("containerd CRI: %v", err)
	}
	return c
}

// startProcess starts containerd on Dir/config.toml, its output appended
// to LogPath; c.exited is closed when it exits.
func (c *Containerd) startProcess() error {
	log, err := os.OpenFile(c.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(ContainerdBin, "--config", filepath.Join(c.Dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = log, log
	// The plugins containerd runs inherit its environment: meshwire's log.
	cmd.Env = append(os.Environ(), "MESHWIRE_LOG="+c.PluginLogPath(), "MESHWIRE_LOG_LEVEL=debug")
	// Its own process group: a ^C of the test run reaches the test, which
	// then stops containerd in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(exited)
	}()
	c.cmd, c.exited = cmd, exited
	return nil
}

// KillAndRestart kills containerd with SIGKILL, as a node's OOM killer or
// a crash does (its shims, the plugins it started and the pods run on),
// starts it again on the same state and waits until CRI is ready.
func (c *Containerd) KillAndRestart() error {
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	select {
	case <-c.exited:
	case <-time.After(stopTimeout):
		return fmt.Errorf("containerd (pid %d) did not die", c.cmd.Process.Pid)
	}
	if err := c.startProcess(); err != nil {
		return err
	}
	if err := c.waitServing(); err != nil {
		return err
	}
	return c.waitReady()
}

func (c *Containerd) hasExited() bool {
	select {
	case <-c.exited:
		return true
	default:
		return false
	}
}

// configTemplate is containerd's config.toml, shared with the cluster's
// scripts (test/cluster/cluster.sh reads the same file).
//
//go:embed containerd.toml
var configTemplate string

// Settings fill containerd.toml's @NAME@ placeholders: paths and names
// without quotes or backslashes, written into TOML strings as they are.
type Settings struct {
	Root, State, Socket, Opt, SandboxImage, Runc, RuncRoot, CNIBin, CNIConf string
}

// RenderConfig renders containerd.toml with s; it fails on a value that would
// need quoting in TOML.
func RenderConfig(s Settings) (string, error) {
	pairs := []string{"@ROOT@", s.Root, "@STATE@", s.State, "@SOCKET@", s.Socket, "@OPT@", s.Opt,
		"@SANDBOX_IMAGE@", s.SandboxImage, "@RUNC@", s.Runc, "@RUNC_ROOT@", s.RuncRoot,
		"@CNI_BIN@", s.CNIBin, "@CNI_CONF@", s.CNIConf}
	for i := 1; i < len(pairs); i += 2 {
		if pairs[i] == "" || strings.ContainsAny(pairs[i], "\"\\\n") {
			return "", fmt.Errorf("containerd config: %s %q is empty or needs quoting", pairs[i-1], pairs[i])
		}
	}
	return strings.NewReplacer(pairs...).Replace(configTemplate), nil
}

// config is this containerd's config.toml: every path under Dir, the
// local sandbox image and the given CNI bin_dir.
func (c *Containerd) config(binDir string) (string, error) {
	return RenderConfig(Settings{Root: filepath.Join(c.Dir, "root"), State: filepath.Join(c.Dir, "state"),
		Socket: c.Socket, Opt: filepath.Join(c.Dir, "opt"), SandboxImage: Image, Runc: RuncBin,
		RuncRoot: c.runcRoot(), CNIBin: binDir, CNIConf: c.ConfDir})
}

func (c *Containerd) runcRoot() string { return filepath.Join(c.Dir, "runc") }

// Ctx is a context bounded for one CRI call.
func Ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), callTimeout)
}

// waitServing waits until containerd answers CRI's Version.
func (c *Containerd) waitServing() error {
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Runtime.Version(ctx, &runtimeapi.VersionRequest{})
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-c.exited:
			return fmt.Errorf("exited before serving: %v", c.cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not serving on %s after %s: %v", c.Socket, startTimeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitReady waits until CRI reports RuntimeReady and NetworkReady (the
// conflist loaded) and knows the image.
func (c *Containerd) waitReady() error {
	deadline := time.Now().Add(startTimeout)
	for {
		err := c.ready()
		if err == nil {
			return nil
		}
		select {
		case <-c.exited:
			return fmt.Errorf("exited: %v", c.cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: %v", startTimeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *Containerd) ready() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := c.Runtime.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return err
	}
	for _, cond := range st.GetStatus().GetConditions() {
		if !cond.Status {
			return fmt.Errorf("%s: %s %s", cond.Type, cond.Reason, cond.Message)
		}
	}
	img, err := c.Images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: Image}})
	if err != nil {
		return err
	}
	if img.GetImage() == nil {
		return fmt.Errorf("image %s not known to CRI yet", Image)
	}
	return nil
}

// PluginLogPath is the meshwire plugins' log (MESHWIRE_LOG in containerd's
// environment, which the plugins inherit); printed when the test fails.
func (c *Containerd) PluginLogPath() string { return filepath.Join(c.Dir, "plugins.log") }

// Log returns containerd's output so far.
func (c *Containerd) Log() string {
	b, _ := os.ReadFile(c.LogPath)
	return string(b)
}

// cleanup removes every pod through CRI (containerd runs the plugins' DEL),
// stops containerd, then removes whatever a failure may have left: shims,
// containers, mounts, network namespaces, directories.
func (c *Containerd) cleanup() {
	t := c.T
	if c.Runtime != nil && c.hasExited() && len(c.ids) > 0 {
		// Died under the test: started again, it finds its pods (their
		// shims still run) and removes them, running the plugins' DEL.
		t.Errorf("containerd exited during the test (%v); starting it again to remove the pods", c.cmd.ProcessState)
		if err := c.startProcess(); err != nil {
			t.Errorf("restart containerd: %v", err)
		} else if err := c.waitServing(); err != nil {
			t.Errorf("restarted containerd: %v", err)
		}
	}
	if c.Runtime != nil && !c.hasExited() {
		if err := c.RemoveAllPods(); err != nil {
			t.Errorf("removing pods at cleanup: %v", err)
		}
	}
	if c.conn != nil {
		_ = c.conn.Close()
	}
	if c.cmd != nil && c.cmd.Process != nil {
		select {
		case <-c.exited:
		default:
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-c.exited:
			case <-time.After(stopTimeout):
				t.Errorf("containerd did not exit %s after SIGTERM; killing it", stopTimeout)
				_ = c.cmd.Process.Kill()
				select {
				case <-c.exited:
				case <-time.After(stopTimeout):
					t.Errorf("containerd (pid %d) did not die", c.cmd.Process.Pid)
				}
			}
		}
	}
	c.killLeftovers()
	c.removeCgroups()
	c.removeShimSockets()
	for _, d := range c.shimDirs {
		_ = os.Remove(d) // only when empty
	}
	if t.Failed() {
		t.Logf("containerd log (%s):\n%s", c.LogPath, tail(c.Log(), 300))
		if b, err := os.ReadFile(c.PluginLogPath()); err == nil {
			t.Logf("meshwire plugins' log (%s):\n%s", c.PluginLogPath(), tail(string(b), 200))
		}
		c.logContainerLogs()
	}
	if c.image {
		releaseImage()
	}
	if err := c.unmountUnder(c.Dir); err != nil {
		t.Errorf("unmount under %s: %v", c.Dir, err)
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		t.Errorf("remove %s: %v", c.Dir, err)
	}
}

// RemoveAllPods stops and removes every pod sandbox (and so its
// containers) containerd knows.
func (c *Containerd) RemoveAllPods() error {
	ctx, cancel := Ctx()
	defer cancel()
	list, err := c.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	var errs []error
	for _, p := range list.GetItems() {
		if err := c.RemovePod(p.Id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killLeftovers, after containerd exited, kills the containers runc still
// has in this containerd's runc root and the shims serving this
// containerd's socket (found by their -address argument), by pid, and
// removes the network namespaces of this containerd's pods still mounted.
func (c *Containerd) killLeftovers() {
	t := c.T
	nsDir := filepath.Join(c.runcRoot(), "k8s.io")
	if entries, err := os.ReadDir(nsDir); err == nil {
		for _, e := range entries {
			id := e.Name()
			out, err := runBounded(exec.Command(RuncBin, "--root", nsDir, "delete", "--force", id), stopTimeout)
			t.Logf("leftover container %s: runc delete --force: %v %s", id, err, out)
		}
	}
	for _, pid := range c.shimPids() {
		t.Logf("leftover shim pid %d: killing it", pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for path := range c.netns {
		if _, err := os.Stat(path); err == nil {
			t.Logf("leftover network namespace %s: removing it", path)
			_ = unix.Unmount(path, unix.MNT_DETACH)
			_ = os.Remove(path)
		}
	}
}

// removeShimSockets removes the sockets that shims killed after
// containerd died leave in /run/containerd/s: containerd 1.6 names them
// sha256(<grpc address>/<namespace>/<id>).
func (c *Containerd) removeShimSockets() {
	for id := range c.ids {
		sum := sha256.Sum256([]byte(filepath.Join(c.Socket, "k8s.io", id)))
		p := filepath.Join("/run/containerd/s", hex.EncodeToString(sum[:]))
		if err := os.Remove(p); err == nil {
			c.T.Logf("removed the leftover shim socket %s of %s", p, id)
		}
	}
}

// removeCgroups removes the pods' cgroup parent from every cgroup
// hierarchy (rmdir: only when no cgroup is left in it).
func (c *Containerd) removeCgroups() {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		c.T.Errorf("cgroup mounts: %v", err)
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ... mountpoint ... - fstype source options
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 || (fields[sep+1] != "cgroup" && fields[sep+1] != "cgroup2") {
			continue
		}
		d := filepath.Join(unescapeMount(fields[4]), c.cgroupParent)
		if err := rmdirTree(d, stopTimeout); err != nil {
			c.T.Errorf("remove cgroup %s: %v", d, err)
		}
	}
}

// rmdirTree removes a cgroup and those under it, deepest first, retrying
// while the kernel still counts the processes of containers killed a
// moment ago (EBUSY), for up to timeout.
func rmdirTree(d string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var dirs []string
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		var err error
		for i := len(dirs) - 1; i >= 0; i-- {
			if e := unix.Rmdir(dirs[i]); e != nil && !errors.Is(e, unix.ENOENT) {
				err = e
			}
		}
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// shimPids lists the containerd-shim processes started for this
// containerd (their command line carries its socket address).
func (c *Containerd) shimPids() []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) == 0 || !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		for i, a := range args {
			if a == "-address" && i+1 < len(args) && args[i+1] == c.Socket {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// unmountUnder detaches every mount at or below dir, deepest first.
func (c *Containerd) unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	var errs []error
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := unix.Unmount(mounts[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("%s: %w", mounts[i], err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// logContainerLogs prints the containers' logs (under Dir/pods).
func (c *Containerd) logContainerLogs() {
	_ = filepath.Walk(filepath.Join(c.Dir, "pods"), func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			c.T.Logf("container log %s:\n%s", p, tail(string(b), 50))
		}
		return nil
	})
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[... %d lines before]", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
