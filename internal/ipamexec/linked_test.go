package ipamexec

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// envAsPlugin makes this test binary, executed as an IPAM plugin, answer
// with a CNI error naming itself (TestMain) instead of running the tests.
const envAsPlugin = "MESHWIRE_IPAMEXEC_TEST_AS_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(envAsPlugin) == "1" {
		os.Stdout.WriteString(`{"cniVersion":"1.0.0","code":7,"msg":"the test binary was executed"}`)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// testBinary copies this test binary (an ELF file with a Go build ID) to
// dir/name and returns its build ID as `go tool buildid` reads it.
func testBinary(t *testing.T, dir, name string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "tool", "buildid", exe).Output()
	if err != nil {
		t.Fatalf("go tool buildid: %v", err)
	}
	src, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	dst.Close()
	return strings.TrimSpace(string(out))
}

func TestFileBuildID(t *testing.T) {
	dir := t.TempDir()
	want := testBinary(t, dir, "plugin")
	if got, err := fileBuildID(filepath.Join(dir, "plugin")); err != nil || got != want {
		t.Fatalf("build ID %q, %v; want %q (go tool buildid)", got, err, want)
	}
	if err := os.Chmod(filepath.Join(dir, "plugin"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := fileBuildID(filepath.Join(dir, "plugin")); err == nil {
		t.Fatal("a file that cannot be executed counts as the plugin")
	}
	for name, content := range map[string]string{
		"script": "#!/bin/sh\nexit 0\n",
		"short":  "\x7fELF",
		"forged": "\x7fELF\x04\x00\x00\x00\xff\xff\x00\x00\x04\x00\x00\x00Go\x00\x00abc", // descriptor longer than the file
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
		if got, err := fileBuildID(p); err != nil || got != "" {
			t.Errorf("%s: build ID %q, %v; want none", name, got, err)
		}
	}
}

// FuzzGoBuildID: whatever the bytes, no panic, and an ID found is bytes
// of the input.
func FuzzGoBuildID(f *testing.F) {
	f.Add([]byte("\x7fELF\x00\x00\x00\x00\x04\x00\x00\x00\x03\x00\x00\x00\x04\x00\x00\x00Go\x00\x00abc"))
	f.Add([]byte("\x7fELF\x04\x00\x00\x00\x00\x00\x00\x80\x04\x00\x00\x00Go\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if id := goBuildID(b); id != "" && !strings.Contains(string(b), id) {
			t.Fatalf("id %q is not in the input", id)
		}
	})
}

// linkedFake is a linked plugin "fake" whose calls are recorded.
func linkedFake(t *testing.T, buildID string) *[]string {
	t.Helper()
	var calls []string
	rec := func(cmd string) func(*skel.CmdArgs) error {
		return func(a *skel.CmdArgs) error {
			calls = append(calls, cmd+" "+a.ContainerID+" "+a.IfName)
			if strings.Contains(string(a.StdinData), `"mode":"error"`) {
				return types.NewError(11, "busy", "")
			}
			if strings.Contains(string(a.StdinData), `"mode":"panic"`) {
				panic("boom")
			}
			if strings.Contains(string(a.StdinData), `"mode":"plain"`) {
				return errors.New("plain failure")
			}
			return nil
		}
	}
	Link(Linked{
		Type: "fake", BuildID: buildID,
		Add: func(a *skel.CmdArgs) (*current.Result, string, error) {
			if err := rec("ADD")(a); err != nil {
				return nil, "", err
			}
			r := &current.Result{CNIVersion: current.ImplementedSpecVersion}
			ip, _ := types.ParseCIDR("198.18.95.7/24")
			r.IPs = []*current.IPConfig{{Address: *ip}}
			return r, "0.4.0", nil
		},
		Del: rec("DEL"), Check: rec("CHECK"), GC: rec("GC"), Status: rec("STATUS"),
	})
	t.Cleanup(func() { linked = nil })
	t.Setenv("CNI_CONTAINERID", "c1")
	t.Setenv("CNI_IFNAME", "eth0")
	return &calls
}

// TestLinkedRunsInProcess: with the linked plugin's own binary on CNI_PATH,
// every command runs in-process with the CNI environment, ADD's result goes
// through the plugin's printed version, and failures are the CNI errors the
// binary would print.
func TestLinkedRunsInProcess(t *testing.T) {
	dir := t.TempDir()
	id := testBinary(t, dir, "fake")
	t.Setenv("CNI_PATH", dir)
	calls := linkedFake(t, id)
	ctx := context.Background()
	res, release, err := Add(ctx, "fake", conf("ok"))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IPs) != 1 || res.IPs[0].Address.String() != "198.18.95.7/24" {
		t.Fatalf("result %+v", res)
	}
	release()
	for _, fn := range []func(context.Context, string, []byte) error{Check, Status, GC} {
		if err := fn(ctx, "fake", conf("ok")); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(*calls, ","); got != "ADD c1 eth0,DEL c1 eth0,CHECK c1 eth0,STATUS c1 eth0,GC c1 eth0" {
		t.Fatalf("in-process calls: %s", got)
	}
	if err := Del(ctx, "fake", conf("error")); cnierr.Code(err) != 11 || !strings.Contains(err.Error(), `ipam "fake" DEL`) {
		t.Fatalf("CNI error: %v (code %d)", err, cnierr.Code(err))
	}
	if err := Del(ctx, "fake", conf("plain")); cnierr.Code(err) != 999 || !strings.Contains(err.Error(), "plain failure") {
		t.Fatalf("plain error: %v (code %d)", err, cnierr.Code(err))
	}
	if _, _, err := Add(ctx, "fake", conf("panic")); cnierr.Code(err) != 999 || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("panic: %v (code %d)", err, cnierr.Code(err))
	}
}

// TestLinkedNotTheBinary: another binary of the same type (here a script),
// another build, or EnvExecOnly: the plugin is executed, never the linked
// code.
func TestLinkedNotTheBinary(t *testing.T) {
	record := fakeIPAM(t) // the script "fake" on CNI_PATH
	calls := linkedFake(t, "some/other/build/id")
	ctx := context.Background()
	if _, release, err := Add(ctx, "fake", conf("ok")); err != nil {
		t.Fatal(err)
	} else {
		release()
	}
	dir := t.TempDir()
	id := testBinary(t, dir, "fake")
	linkedFake(t, id)
	t.Setenv("CNI_PATH", filepath.Dir(record)) // the script again, though the linked ID is a real one
	if err := Check(ctx, "fake", conf("ok")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CNI_PATH", dir+string(os.PathListSeparator)+filepath.Dir(record))
	t.Setenv(EnvExecOnly, "1")
	t.Setenv(envAsPlugin, "1")
	// dir/fake is the linked build, but EnvExecOnly forbids in-process:
	// it is executed (a copy of this test binary, answering as TestMain says).
	if err := GC(ctx, "fake", conf("ok")); err == nil || !strings.Contains(err.Error(), "the test binary was executed") {
		t.Fatalf("EnvExecOnly: %v; want the binary's own error", err)
	}
	if len(*calls) != 0 {
		t.Fatalf("linked code ran for another binary: %v", *calls)
	}
	got, _ := os.ReadFile(record)
	if string(got) != "ADD kept\nDEL kept\nCHECK kept\n" {
		t.Fatalf("the script saw:\n%s", got)
	}
}
