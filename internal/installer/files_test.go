package installer

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Ino
}

func noTemps(t *testing.T, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), tempSuffix) {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}

// TestCopyBinaryOverRunning installs a plugin (a copy of /bin/sleep), runs
// it, installs a new version over it while it runs: the process goes on
// with the old file, the path holds the new one, complete and executable.
func TestCopyBinaryOverRunning(t *testing.T) {
	sleep, err := os.ReadFile("/bin/sleep")
	if err != nil {
		t.Fatal(err)
	}
	src, dst := t.TempDir(), t.TempDir()
	srcPath, dstPath := filepath.Join(src, "bridge"), filepath.Join(dst, "bridge")
	if err := os.WriteFile(srcPath, sleep, 0o644); err != nil {
		t.Fatal(err)
	}
	if changed, err := CopyBinary(srcPath, dst, "bridge"); err != nil || !changed {
		t.Fatalf("first copy: %v %v", changed, err)
	}
	cmd := exec.Command(dstPath, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.Process.Kill() == nil {
			<-exited
		}
	})
	oldIno := inode(t, dstPath)

	// A new version: the same program with a few more bytes at the end
	// (an ELF file runs with trailing data).
	v2 := append(append([]byte{}, sleep...), []byte("meshwire v2")...)
	if err := os.WriteFile(srcPath, v2, 0o644); err != nil {
		t.Fatal(err)
	}
	if changed, err := CopyBinary(srcPath, dst, "bridge"); err != nil || !changed {
		t.Fatalf("copy over the running binary: %v %v", changed, err)
	}
	got, err := os.ReadFile(dstPath)
	if err != nil || !bytes.Equal(got, v2) {
		t.Fatalf("installed file is not the new version (%d bytes, %v)", len(got), err)
	}
	if st, _ := os.Stat(dstPath); st.Mode().Perm() != 0o755 {
		t.Fatalf("mode %v", st.Mode())
	}
	if inode(t, dstPath) == oldIno {
		t.Fatal("the old file was rewritten in place instead of replaced")
	}
	select {
	case err := <-exited:
		t.Fatalf("the running plugin ended: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	exe, err := os.Readlink("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/exe")
	if err != nil || !strings.HasSuffix(exe, "(deleted)") {
		t.Fatalf("the running process's executable: %q %v, want the old, unlinked file", exe, err)
	}
	if out, err := exec.Command(dstPath, "0").CombinedOutput(); err != nil {
		t.Fatalf("the new version does not run: %v %s", err, out)
	}
	noTemps(t, dst)

	// Unchanged contents are not rewritten.
	ino := inode(t, dstPath)
	if changed, err := CopyBinary(srcPath, dst, "bridge"); err != nil || changed {
		t.Fatalf("copy of the same contents: %v %v", changed, err)
	}
	if inode(t, dstPath) != ino {
		t.Fatal("same contents rewritten")
	}
	// A wrong mode is fixed in place.
	if err := os.Chmod(dstPath, 0o644); err != nil {
		t.Fatal(err)
	}
	if changed, err := CopyBinary(srcPath, dst, "bridge"); err != nil || !changed {
		t.Fatalf("copy over a file with mode 0644: %v %v", changed, err)
	}
	if st, _ := os.Stat(dstPath); st.Mode().Perm() != 0o755 || inode(t, dstPath) != ino {
		t.Fatalf("mode %v, inode changed %v", st.Mode(), inode(t, dstPath) != ino)
	}
}

func TestCopyBinaryErrors(t *testing.T) {
	dst := t.TempDir()
	if _, err := CopyBinary(filepath.Join(t.TempDir(), "nope"), dst, "nope"); err == nil {
		t.Fatal("missing source copied")
	}
	if _, err := CopyBinary(t.TempDir(), dst, "dir"); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("directory as source: %v", err)
	}
	noTemps(t, dst)
}

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	if changed, err := WriteFile(dir, "a.conflist", []byte("one")); err != nil || !changed {
		t.Fatal(changed, err)
	}
	p := filepath.Join(dir, "a.conflist")
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o644 {
		t.Fatalf("new file mode %v", st.Mode())
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	ino := inode(t, p)
	if changed, err := WriteFile(dir, "a.conflist", []byte("one")); err != nil || changed || inode(t, p) != ino {
		t.Fatalf("same contents rewritten: %v %v", changed, err)
	}
	if changed, err := WriteFile(dir, "a.conflist", []byte("two")); err != nil || !changed {
		t.Fatal(changed, err)
	}
	if b, _ := os.ReadFile(p); string(b) != "two" {
		t.Fatalf("contents %q", b)
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o600 || inode(t, p) == ino {
		t.Fatalf("mode %v (want the old 0600), replaced %v", st.Mode(), inode(t, p) != ino)
	}
	noTemps(t, dir)
}

func TestRemoveTemps(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{".bridge.meshwire-123", ".10-calico.conflist.meshwire-9", "bridge", ".other", "x.meshwire-1"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gone, err := removeTemps(dir)
	if err != nil || strings.Join(gone, ",") != ".10-calico.conflist.meshwire-9,.bridge.meshwire-123" {
		t.Fatalf("removed %q, %v", gone, err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 3 {
		t.Fatalf("%d files left, want 3", len(ents))
	}
}

// oldTempName is the pattern isTempName replaced.
var oldTempName = regexp.MustCompile(`^\..+\.meshwire-[0-9]+$`)

func TestIsTempName(t *testing.T) {
	for name, want := range map[string]bool{
		".bridge.meshwire-123":           true,
		".10-calico.conflist.meshwire-9": true,
		".a.meshwire-1.meshwire-2":       true,
		"..meshwire-1":                   false,
		".meshwire-1":                    false,
		"bridge.meshwire-1":              false,
		".bridge.meshwire-":              false,
		".bridge.meshwire-12a":           false,
		".bridge.meshwire-1.conflist":    false,
		".other":                         false,
		"":                               false,
	} {
		if got := isTempName(name); got != want || oldTempName.MatchString(name) != want {
			t.Errorf("isTempName(%q) = %v, want %v (the pattern it replaced: %v)", name, got, want, oldTempName.MatchString(name))
		}
	}
}
