// Package netns is meshwire's one place for network namespaces. It
// creates, finds and removes named ones, laid out like iproute2's (`ip
// netns`: a bind mount of the namespace at /run/netns/NAME, so that `ip
// netns exec NAME ...` works on them too), opens a plugin's CNI_NETNS for
// netlink from the host thread with dumps that survive interruption (Open,
// NS, Netlink), and runs code inside one (Enter).
package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"

	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// RunDir is where named namespaces are mounted, as iproute2 does.
var RunDir = "/run/netns"

// ValidName reports whether name can be used for a namespace: 1 to 63
// letters, digits, '.', '_' or '-', starting with a letter or digit. (A loop,
// not a regular expression: compiling one at start-up costs every plugin
// call a quarter of a millisecond.)
func ValidName(name string) error {
	ok := len(name) > 0 && len(name) <= 63
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		ok = alnum || i > 0 && (c == '.' || c == '_' || c == '-')
	}
	if !ok {
		return fmt.Errorf("invalid namespace name %q: use 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// Path is the file a named namespace is mounted on.
func Path(name string) string { return filepath.Join(RunDir, name) }

// Exists reports whether NAME is a mounted network namespace.
func Exists(name string) bool { return IsNetNS(Path(name)) }

// IsNetNS reports whether path is a namespace file (nsfs).
func IsNetNS(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

// ErrExists is returned by Create when the namespace already exists.
var ErrExists = errors.New("network namespace already exists")

// Create makes a new network namespace and mounts it at Path(name). It
// returns ErrExists (and the path) when the namespace is already there.
func Create(name string) (string, error) {
	if err := ValidName(name); err != nil {
		return "", err
	}
	if err := os.MkdirAll(RunDir, 0o755); err != nil {
		return "", err
	}
	p := Path(name)
	if IsNetNS(p) {
		return p, ErrExists
	}
	f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			// A mount point left without a mount (a crash between the two
			// steps): reuse it.
			if IsNetNS(p) {
				return p, ErrExists
			}
		} else {
			return "", err
		}
	} else {
		f.Close()
	}
	errc := make(chan error, 1)
	go func() {
		// Unshare moves only this thread into the new namespace; it is put
		// back before being handed to the Go scheduler again. If it cannot be
		// put back it stays locked, and the runtime ends it with the
		// goroutine (or, on the main thread, parks it), so no other goroutine
		// ever runs in the wrong namespace.
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open current namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread() // still in the original namespace
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		mountErr := unix.Mount("/proc/thread-self/ns/net", p, "none", unix.MS_BIND, "")
		if err := vnetns.Set(orig); err == nil {
			runtime.UnlockOSThread()
		}
		if mountErr != nil {
			mountErr = fmt.Errorf("bind mount %s: %w", p, mountErr)
		}
		errc <- mountErr
	}()
	if err := <-errc; err != nil {
		os.Remove(p)
		return "", err
	}
	return p, nil
}

// Delete unmounts and removes a named namespace. A namespace that does not
// exist is not an error.
func Delete(name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	return DeletePath(Path(name))
}

// DeletePath unmounts and removes a namespace mount point.
func DeletePath(p string) error {
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", p, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// List returns the names of the mounted namespaces in RunDir, sorted.
func List() ([]string, error) {
	ents, err := os.ReadDir(RunDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if IsNetNS(filepath.Join(RunDir, e.Name())) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}
