package installer

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Binary is one file the installer copies into the CNI binary directory.
type Binary struct {
	Source string // file name in the source directory
	Name   string // name in the CNI binary directory
}

// plugins are the plugin binaries `make build` puts in bin/ (not the
// commands meshwire and iptables-init, not bin/test).
var pluginNames = []string{"bridge", "veth", "loopback", "host-local", "portmap", "bandwidth", "intercept"}

// aliases are the plugins installed under a second name too, as the
// Makefile's PLUGIN_ALIASES does for `make install`: the name configs
// written for the reference plugins give as "type".
var aliases = []Binary{{Source: "veth", Name: "ptp"}}

// Binaries lists what the installer copies, in order.
func Binaries() []Binary {
	var out []Binary
	for _, p := range pluginNames {
		out = append(out, Binary{Source: p, Name: p})
	}
	return append(out, aliases...)
}

// binMode is the mode of an installed plugin.
const binMode = 0o755

// tempSuffix marks meshwire's temporary files: hidden, and ending in a
// random number rather than a config extension, so that no runtime reads
// one as a config or runs one as a plugin.
const tempSuffix = ".meshwire-"

// isTempName reports whether name is one of meshwire's temporary files:
// "." + a name + tempSuffix + a number.
func isTempName(name string) bool {
	i := strings.LastIndex(name, tempSuffix)
	if i < 2 || name[0] != '.' {
		return false
	}
	num := name[i+len(tempSuffix):]
	return num != "" && strings.Trim(num, "0123456789") == ""
}

// CopyBinary installs srcPath as dir/name, atomically: the new contents go
// to a temporary file in dir, which is synced, made 0755 and renamed over
// the old one. A running plugin keeps its old file (the rename unlinks the
// old inode; nothing ever opens it for writing, which would fail with
// ETXTBSY anyway), and a runtime never sees a half-written plugin. A file
// with the same contents is not rewritten (its mode is fixed if need be).
func CopyBinary(srcPath, dir, name string) (changed bool, err error) {
	src, err := os.Open(srcPath)
	if err != nil {
		return false, err
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return false, err
	}
	if !st.Mode().IsRegular() {
		return false, fmt.Errorf("%s: not a regular file", srcPath)
	}
	dst := filepath.Join(dir, name)
	same, err := sameContents(src, st.Size(), dst)
	if err != nil {
		return false, err
	}
	if same {
		dt, err := os.Stat(dst)
		if err != nil {
			return false, err
		}
		if dt.Mode().Perm() == binMode {
			return false, nil
		}
		return true, os.Chmod(dst, binMode)
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return false, err
	}
	return true, writeAtomic(dir, name, binMode, nil, func(w io.Writer) error {
		_, err := io.Copy(w, src)
		return err
	})
}

// sameContents reports whether the file at path holds exactly what r (of
// size n) holds.
func sameContents(r io.Reader, n int64, path string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false, err
	}
	if !st.Mode().IsRegular() || st.Size() != n {
		return false, nil
	}
	a, b := make([]byte, 256<<10), make([]byte, 256<<10)
	for {
		na, ea := io.ReadFull(r, a)
		nb, eb := io.ReadFull(f, b)
		if na != nb || !bytes.Equal(a[:na], b[:nb]) {
			return false, nil
		}
		if ea == io.EOF || ea == io.ErrUnexpectedEOF {
			return eb == io.EOF || eb == io.ErrUnexpectedEOF, nil
		}
		if ea != nil {
			return false, ea
		}
		if eb != nil {
			return false, eb
		}
	}
}

// WriteFile writes data to dir/name atomically (temporary file in dir,
// fsync, rename, fsync of dir), unless the file already holds exactly data.
// A file that exists keeps its mode and owner; a new one is 0644.
func WriteFile(dir, name string, data []byte) (changed bool, err error) {
	path := filepath.Join(dir, name)
	old, err := os.ReadFile(path)
	if err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	mode := os.FileMode(0o644)
	var like os.FileInfo
	if st, err := os.Stat(path); err == nil {
		mode, like = st.Mode().Perm(), st
	}
	return true, writeAtomic(dir, name, mode, like, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// writeAtomic writes a temporary file in dir with fill, gives it mode (and
// like's owner, when given), syncs it, renames it to name and syncs dir.
// The temporary file is removed on failure.
func writeAtomic(dir, name string, mode os.FileMode, like os.FileInfo, fill func(io.Writer) error) error {
	tmp, err := os.CreateTemp(dir, "."+name+tempSuffix+"*")
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := fill(tmp); err != nil {
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		return err
	}
	if like != nil {
		if st, isUnix := like.Sys().(*syscall.Stat_t); isUnix && (int(st.Uid) != os.Geteuid() || int(st.Gid) != os.Getegid()) {
			if err := tmp.Chown(int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
		}
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return err
	}
	ok = true
	return syncDir(dir)
}

// syncDir makes a rename or removal in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return err
	}
	return nil
}

// removeFile removes dir/name and syncs dir; a missing file is no error.
func removeFile(dir, name string) error {
	if err := os.Remove(filepath.Join(dir, name)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	return syncDir(dir)
}

// removeTemps removes the temporary files a killed installer left in dir
// and returns their names.
func removeTemps(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var gone []string
	for _, e := range ents {
		if e.Type().IsRegular() && isTempName(e.Name()) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return gone, err
			}
			gone = append(gone, e.Name())
		}
	}
	return gone, nil
}
