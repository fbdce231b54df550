package ipamexec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// Linked is an IPAM plugin compiled into the calling binary. When the
// plugin found on CNI_PATH for its type is the very binary built together
// with the caller (its Go build ID is BuildID), the call runs in-process:
// the same code on the same input and environment, with its result read
// back exactly as the printed one would be, but without starting a
// process. Anything else found there (another build, another
// implementation, a wrapper script) is executed as usual, and so is
// everything when EnvExecOnly is set.
type Linked struct {
	Type    string
	BuildID string
	// Add returns the result and the spec version the plugin prints it in.
	Add                    func(*skel.CmdArgs) (*current.Result, string, error)
	Del, Check, GC, Status func(*skel.CmdArgs) error
}

// EnvExecOnly, set to 1, makes every IPAM call start the plugin's binary.
const EnvExecOnly = "MESHWIRE_IPAM_EXEC"

var linked *Linked

// Link registers the IPAM plugin compiled into this binary; the plugin's
// main calls it (see hostlocal.Linked), so that what runs in-process is
// visible where the binary starts.
func Link(l Linked) { linked = &l }

// linkedFor returns the linked plugin when the binary at path, found on
// CNI_PATH for typ, is its own build.
func linkedFor(typ, path string) *Linked {
	l := linked
	if l == nil || l.Type != typ || l.BuildID == "" || os.Getenv(EnvExecOnly) == "1" {
		return nil
	}
	id, err := fileBuildID(path)
	if err != nil || id != l.BuildID {
		slog.Debug("ipam: executing the plugin", "path", path, "buildID", id, "linked", l.BuildID, "error", err)
		return nil
	}
	return l
}

// fileBuildID returns the Go build ID of the executable at path: the
// "Go" ELF note the Go linker writes within the file's first pages. A file
// that is not executable, not ELF, or has no such note has none.
func fileBuildID(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s is not an executable file", path)
	}
	buf := make([]byte, 32<<10)
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return "", err
	}
	return goBuildID(buf[:n]), nil
}

// goBuildID finds the Go build ID note in the start of an ELF file: name
// size 4, descriptor size n, type 4, name "Go\0\0", then n bytes of ID.
func goBuildID(b []byte) string {
	if !bytes.HasPrefix(b, []byte("\x7fELF")) {
		return ""
	}
	tag := []byte("\x04\x00\x00\x00Go\x00\x00") // type, name
	for off := 0; ; {
		i := bytes.Index(b[off:], tag)
		if i < 0 {
			return ""
		}
		at := off + i
		off = at + 1
		if at < 8 || b[at-8] != 4 || b[at-7] != 0 || b[at-6] != 0 || b[at-5] != 0 {
			continue
		}
		n := int(b[at-4]) | int(b[at-3])<<8 | int(b[at-2])<<16 | int(b[at-1])<<24
		start := at + len(tag)
		if n <= 0 || n > 1024 || start+n > len(b) {
			continue
		}
		return string(b[start : start+n])
	}
}

// run executes cmd in-process, as the plugin's binary would: the
// environment's CNI variables, stdin as the config, ADD's result printed
// in the plugin's own spec version, an error as the CNI error the binary
// would print, a panic as an internal error.
func (l *Linked) run(cmd string, stdin []byte) (out []byte, err error) {
	args := &skel.CmdArgs{
		ContainerID: os.Getenv("CNI_CONTAINERID"),
		Netns:       os.Getenv("CNI_NETNS"),
		IfName:      os.Getenv("CNI_IFNAME"),
		Args:        os.Getenv("CNI_ARGS"),
		Path:        os.Getenv("CNI_PATH"),
		StdinData:   stdin,
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("internal error: %v", r)
		}
		if err != nil {
			var e *types.Error
			if !errors.As(err, &e) {
				e = &types.Error{Code: types.ErrInternal, Msg: err.Error()}
			}
			out, err = nil, e
		}
	}()
	slog.Debug("ipam in-process", "type", l.Type, "command", cmd)
	var fn func(*skel.CmdArgs) error
	switch cmd {
	case "ADD":
		r, ver, err := l.Add(args)
		if err != nil {
			return nil, err
		}
		printed, err := r.GetAsVersion(ver)
		if err != nil {
			return nil, err
		}
		var buf bytes.Buffer
		if err := printed.PrintTo(&buf); err != nil {
			return nil, err
		}
		return buf.Bytes(), nil
	case "DEL":
		fn = l.Del
	case "CHECK":
		fn = l.Check
	case "GC":
		fn = l.GC
	case "STATUS":
		fn = l.Status
	}
	if fn == nil {
		return nil, nil
	}
	return nil, fn(args)
}
