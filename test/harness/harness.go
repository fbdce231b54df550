// Package harness runs meshwire's built plugin binaries the way a container
// runtime does (through libcni, with a conflist and a runtime config) inside
// throwaway network namespaces, and lets tests look at what the kernel shows.
//
// Every resource a test creates through the harness (namespaces, libcni cache,
// attachments) is removed by t.Cleanup, also when the test fails. Kernel tests
// need root; the harness fails (never skips) without it, so that CI cannot
// silently pass over them.
package harness

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/meshwire/meshwire/internal/kerneltest"
	_ "github.com/meshwire/meshwire/internal/probe" // settles Go's IPv6 probe in the host namespace
)

// EnvBinDir names a directory of already built binaries (the Makefile sets it
// to bin/ after `make build`); without it the harness builds them itself.
const EnvBinDir = "MESHWIRE_BIN_DIR"

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// RepoRoot is the directory holding go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// BinDir returns the directory with the plugin binaries, building them once
// per test process (static, as the Makefile does) unless EnvBinDir is set.
func BinDir(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if d := os.Getenv(EnvBinDir); d != "" {
			binDir = d
			return
		}
		root, err := RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "meshwire-bin-")
		if err != nil {
			buildErr = err
			return
		}
		// The Makefile's build, so that the binaries are made and stamped
		// exactly as they ship (shipped programs in dir, test-only ones in
		// dir/test).
		cmd := exec.Command("make", "--no-print-directory", "build", "BIN="+dir)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("make build: %v\n%s", err, out)
			return
		}
		binDir = dir
	})
	if buildErr != nil {
		t.Fatalf("building plugins: %v", buildErr)
	}
	return binDir
}

// H is one test's handle on the harness.
type H struct {
	T        testing.TB
	BinDir   string
	CNIPath  []string
	CacheDir string
	CNI      *libcni.CNIConfig
}

// RequireRoot fails the test when not running as root and takes the
// node-wide lock of kernel tests (kerneltest.Require): kernel tests must
// run, never be skipped.
func RequireRoot(t testing.TB) {
	t.Helper()
	kerneltest.Require(t)
}

// New returns a harness for t. extraPath directories are searched after the
// meshwire binaries (e.g. the reference plugins).
func New(t testing.TB, extraPath ...string) *H {
	t.Helper()
	RequireRoot(t)
	h := &H{T: t, BinDir: BinDir(t), CacheDir: t.TempDir()}
	h.CNIPath = append([]string{h.BinDir}, extraPath...)
	h.CNI = libcni.NewCNIConfigWithCacheDir(h.CNIPath, h.CacheDir, nil)
	return h
}

// RandomID returns a container id in the form runtimes use (64 hex digits).
func RandomID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ConfList parses a conflist, failing the test when it does not parse.
func (h *H) ConfList(conflist string) *libcni.NetworkConfigList {
	h.T.Helper()
	l, err := libcni.ConfListFromBytes([]byte(conflist))
	if err != nil {
		h.T.Fatalf("parse conflist: %v\n%s", err, conflist)
	}
	return l
}

// Single wraps one plugin config into a conflist of the given spec version.
func (h *H) Single(cniVersion, name, pluginJSON string) *libcni.NetworkConfigList {
	return h.ConfList(fmt.Sprintf(`{"cniVersion":%q,"name":%q,"plugins":[%s]}`, cniVersion, name, pluginJSON))
}

// Attachment is one (container, interface) wired by a conflist.
type Attachment struct {
	h    *H
	List *libcni.NetworkConfigList
	RT   *libcni.RuntimeConf
	NS   *NS
}

// Attach prepares an attachment of ns to list with interface ifName and the
// given capability arguments (runtimeConfig). DEL runs at cleanup, so a
// failing test leaves nothing behind; tests may DEL earlier themselves.
func (h *H) Attach(list *libcni.NetworkConfigList, ns *NS, ifName string, capArgs map[string]any) *Attachment {
	rt := &libcni.RuntimeConf{
		ContainerID:    RandomID(),
		NetNS:          ns.Path,
		IfName:         ifName,
		CapabilityArgs: capArgs,
	}
	a := &Attachment{h: h, List: list, RT: rt, NS: ns}
	h.T.Cleanup(func() { _ = a.Del() })
	return a
}

func ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 60*time.Second)
}

// Add runs ADD of the whole conflist.
func (a *Attachment) Add() (types.Result, error) {
	c, cancel := ctx()
	defer cancel()
	return a.h.CNI.AddNetworkList(c, a.List, a.RT)
}

// MustAdd runs ADD and returns the result in the current spec's form.
func (a *Attachment) MustAdd() *current.Result {
	a.h.T.Helper()
	r, err := a.Add()
	if err != nil {
		a.h.T.Fatalf("ADD %s: %v", a.List.Name, err)
	}
	cr, err := current.NewResultFromResult(r)
	if err != nil {
		a.h.T.Fatalf("ADD %s: convert result: %v", a.List.Name, err)
	}
	return cr
}

// Check runs CHECK with the cached result, as runtimes do.
func (a *Attachment) Check() error {
	c, cancel := ctx()
	defer cancel()
	return a.h.CNI.CheckNetworkList(c, a.List, a.RT)
}

// Del runs DEL of the whole conflist.
func (a *Attachment) Del() error {
	c, cancel := ctx()
	defer cancel()
	return a.h.CNI.DelNetworkList(c, a.List, a.RT)
}

// GCAttachment names this attachment in a GC valid list.
func (a *Attachment) GCAttachment() types.GCAttachment {
	return types.GCAttachment{ContainerID: a.RT.ContainerID, IfName: a.RT.IfName}
}

// Status runs STATUS of the conflist.
func (h *H) Status(list *libcni.NetworkConfigList) error {
	c, cancel := ctx()
	defer cancel()
	return h.CNI.GetStatusNetworkList(c, list)
}

// GC runs GC of the conflist with the given valid attachments.
func (h *H) GC(list *libcni.NetworkConfigList, valid ...types.GCAttachment) error {
	c, cancel := ctx()
	defer cancel()
	return h.CNI.GCNetworkList(c, list, &libcni.GCArgs{ValidAttachments: valid})
}

// Version asks a plugin binary for its VERSION answer through libcni.
func (h *H) Version(plugin string) ([]string, error) {
	c, cancel := ctx()
	defer cancel()
	info, err := h.CNI.GetVersionInfo(c, plugin)
	if err != nil {
		return nil, err
	}
	return info.SupportedVersions(), nil
}

// Exec runs a plugin binary directly with the given environment (nothing of
// the test's environment leaks in except PATH) and stdin, for the cases a
// runtime would never produce: missing variables, broken JSON.
type ExecResult struct {
	Stdout, Stderr []byte
	ExitCode       int
}

// CNIError decodes stdout as a CNI error object.
func (r ExecResult) CNIError() (*types.Error, error) {
	var e types.Error
	if err := json.Unmarshal(r.Stdout, &e); err != nil {
		return nil, fmt.Errorf("stdout is not a CNI error object: %v: %q", err, r.Stdout)
	}
	return &e, nil
}

// WantCNIError fails t unless the run exited non-zero with a CNI error
// object of the given code whose message names every one of mentions, and
// returns that error.
func (r ExecResult) WantCNIError(t testing.TB, code uint, mentions ...string) *types.Error {
	t.Helper()
	if r.ExitCode == 0 {
		t.Fatalf("exit code 0, stdout %s", r.Stdout)
	}
	e, err := r.CNIError()
	if err != nil {
		t.Fatal(err)
	}
	if e.Code != code {
		t.Fatalf("code %d (%s), want %d", e.Code, e.Msg, code)
	}
	for _, m := range mentions {
		if !strings.Contains(e.Msg, m) {
			t.Fatalf("message %q does not name %q", e.Msg, m)
		}
	}
	return e
}

func (h *H) Exec(plugin string, env map[string]string, stdin []byte) ExecResult {
	h.T.Helper()
	cmd := exec.Command(filepath.Join(h.BinDir, plugin))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	res := ExecResult{Stdout: out.Bytes(), Stderr: errb.Bytes()}
	if ee, ok := err.(*exec.ExitError); ok {
		res.ExitCode = ee.ExitCode()
	} else if err != nil {
		h.T.Fatalf("run %s: %v", plugin, err)
	}
	return res
}

// Run runs a command on the host and returns its combined output.
func Run(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
