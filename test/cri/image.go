package cri

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Image is the reference of the busybox image every containerd started here
// holds: the sandbox ("pause") image and the image of test containers. Its
// default command sleeps, as a pause container does.
const Image = "localhost/meshwire-cri-busybox:1"

// Busybox is Debian's busybox-static (test/deps.sh installs it).
const Busybox = "/bin/busybox"

// The image archive is built once per test process and kept while some
// containerd started by this package runs (users counts them).
var (
	imageMu    sync.Mutex
	imageDir   string
	imageUsers int
)

// acquireImage returns the path of the image as a docker-archive, building
// it when no containerd of this process holds it; releaseImage must follow.
func acquireImage() (string, error) {
	imageMu.Lock()
	defer imageMu.Unlock()
	if imageDir == "" {
		dir, err := os.MkdirTemp("", "meshwire-cri-image-")
		if err != nil {
			return "", err
		}
		if err := buildImage(dir); err != nil {
			_ = os.RemoveAll(dir)
			return "", err
		}
		imageDir = dir
	}
	imageUsers++
	return filepath.Join(imageDir, "image.tar"), nil
}

func releaseImage() {
	imageMu.Lock()
	defer imageMu.Unlock()
	if imageUsers--; imageUsers == 0 && imageDir != "" {
		_ = os.RemoveAll(imageDir)
		imageDir = ""
	}
}

// buildImage makes dir/image.tar without a registry: a rootfs of busybox and
// its applet links, as a tar; `podman import` of it (in a podman store of its
// own under dir, so that the host's store is left alone); `podman save
// --format docker-archive`, which `ctr images import` reads.
func buildImage(dir string) error {
	rootfs := filepath.Join(dir, "rootfs.tar")
	if err := writeRootfs(rootfs); err != nil {
		return fmt.Errorf("busybox rootfs: %w", err)
	}
	podman := []string{
		"--root", filepath.Join(dir, "podman", "root"),
		"--runroot", filepath.Join(dir, "podman", "run"),
		"--tmpdir", filepath.Join(dir, "podman", "tmp"),
		"--storage-driver", "vfs",
		"--events-backend", "none",
		"--cgroup-manager", "cgroupfs",
	}
	steps := [][]string{
		append(append([]string{}, podman...), "import",
			"--change", `CMD ["/bin/sleep", "2147483647"]`,
			"--change", "ENV PATH=/bin",
			rootfs, Image),
		append(append([]string{}, podman...), "save", "--format", "docker-archive",
			"-o", filepath.Join(dir, "image.tar"), Image),
	}
	for _, args := range steps {
		cmd := exec.Command("podman", args...)
		cmd.Env = append(os.Environ(), "TMPDIR="+dir)
		if out, err := runBounded(cmd, 60*time.Second); err != nil {
			return fmt.Errorf("podman %s: %v\n%s", args[len(podman)], err, out)
		}
	}
	// The podman store is not needed any more (vfs: plain directories).
	return os.RemoveAll(filepath.Join(dir, "podman"))
}

// writeRootfs writes a tar of a minimal root filesystem: /bin/busybox, a
// link per applet, /tmp (sticky, world-writable), /etc/passwd and
// /etc/group with root and the proxy user 1337.
func writeRootfs(path string) error {
	bin, err := os.ReadFile(Busybox)
	if err != nil {
		return err
	}
	// The image has no libc: the dynamic busybox of Debian's busybox
	// package would not run in it.
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("%s: %v", Busybox, err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked: install busybox-static (test/deps.sh does)", Busybox)
		}
	}
	out, err := exec.Command(Busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("%s --list: %v", Busybox, err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(0, 0)
	dir := func(name string, mode int64) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: mtime})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: mtime}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, d := range []string{"bin", "dev", "etc", "proc", "sys", "root", "var"} {
		if err := dir(d, 0o755); err != nil {
			return err
		}
	}
	if err := dir("tmp", 0o1777); err != nil {
		return err
	}
	if err := file("bin/busybox", 0o755, bin); err != nil {
		return err
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777, ModTime: mtime}); err != nil {
			return err
		}
	}
	if err := file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nproxy:x:1337:1337:proxy:/tmp:/bin/sh\n")); err != nil {
		return err
	}
	if err := file("etc/group", 0o644, []byte("root:x:0:\nproxy:x:1337:\n")); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// runBounded runs cmd with its combined output, killing it after limit.
func runBounded(cmd *exec.Cmd, limit time.Duration) ([]byte, error) {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.Bytes(), err
	case <-time.After(limit):
		_ = cmd.Process.Kill()
		<-done
		return out.Bytes(), fmt.Errorf("still running after %s, killed", limit)
	}
}
