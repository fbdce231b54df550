// Package meshedpods keeps, on the node, the runtime's call that meshed
// each pod: the intercept plugin's ADD (its config with the prevResult,
// CNI_ARGS, the namespace path, the interface) for a pod whose
// interception the plugin installed. The plugin writes the call once the
// rules (or the EBPF registration) are in place and removes it at DEL,
// before anything else. The node agent repeats it: CHECK every interval,
// and ADD (which converges on the config) when CHECK finds the pod's
// interception gone or changed, so that no pod stays silently out of the
// mesh: rules flushed inside the pod, a pod whose rules went missing
// while the agent was down.
package meshedpods

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/recordfile"
)

// Dir is where the calls are kept, beside the fast path's records, in the
// directory the node agent's DaemonSet mounts.
const Dir = "/var/lib/cni/meshwire/intercept"

// EnvRepair is set to "1" in the environment of an ADD the node agent
// repeats: the plugin then holds the pod's call for its whole run
// (LockForRepair), does nothing when the call is gone (its DEL ran) or its
// namespace path leads elsewhere, and writes no new call.
const EnvRepair = "MESHWIRE_REPAIR"

// Call is the runtime's ADD of one pod's attachment.
type Call struct {
	ContainerID string `json:"containerID"`
	Netns       string `json:"netns"`
	IfName      string `json:"ifName"`
	Args        string `json:"args,omitempty"`
	// Config is the plugin's stdin, prevResult included.
	Config []byte `json:"config"`
	// NetnsIno and NetnsDev name the namespace Netns led to at ADD: a
	// path that now leads elsewhere (a name reused, a pid's path after
	// the pid went) is not this pod's.
	NetnsIno uint64 `json:"netnsIno"`
	NetnsDev uint64 `json:"netnsDev"`
}

// ErrNotThePod: the call's namespace path no longer leads to the pod's
// namespace (netns.ErrNotThePod).
var ErrNotThePod = netns.ErrNotThePod

// CheckNetns tells whether c's namespace path still leads to the
// namespace recorded at ADD, and not to this process's own.
func (c Call) CheckNetns() error { return netns.CheckIdentity(c.Netns, c.NetnsIno, c.NetnsDev) }

// ErrGone: the pod's call is not kept (its DEL ran).
var ErrGone = errors.New("the pod's intercept call is gone (its DEL ran)")

// lockWait bounds how long a DEL waits for a repair of its pod (the agent
// kills a repair after 30 s).
const lockWait = 35 * time.Second

// LockForRepair holds the call of container id on ifName for a repair
// ADD, until release: the pod's DEL waits for it (Remove), so that what
// the repair installs is what the DEL then removes. It returns the call,
// ErrGone when the DEL ran, or ErrNotThePod.
func LockForRepair(dir, id, ifName string) (c Call, release func(), err error) {
	path := filepath.Join(dirOf(dir), recordfile.Name(id, ifName))
	f, err := lockFile(path)
	if err != nil {
		return Call{}, nil, err
	}
	release = func() { _ = f.Close() }
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		err = ErrGone // removed while this waited
	case err == nil:
		if err = json.Unmarshal(b, &c); err == nil {
			err = c.CheckNetns()
		}
	}
	if err != nil {
		release()
		return Call{}, nil, err
	}
	return c, release, nil
}

// lockFile opens path and takes an exclusive flock on it, waiting at most
// lockWait; ErrGone when there is no file.
func lockFile(path string) (*os.File, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrGone
	}
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(lockWait); ; {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Name is the record's file name (one per attachment).
func (c Call) Name() string { return recordfile.Name(c.ContainerID, c.IfName) }

const what = "the pod's intercept call"

// Write keeps c under dir (Dir when empty).
func Write(dir string, c Call) error { return recordfile.Write(dirOf(dir), c.Name(), what, c) }

// Remove removes the call of container id on ifName, once a repair of the
// pod that holds it is done (waiting at most lockWait, then removing it
// anyway: a DEL always finishes); none is not an error.
func Remove(dir, id, ifName string) error {
	name := recordfile.Name(id, ifName)
	if f, err := lockFile(filepath.Join(dirOf(dir), name)); err == nil {
		defer f.Close()
	}
	return recordfile.Remove(dirOf(dir), name, what)
}

// Exists tells whether the call of container id on ifName is kept.
func Exists(dir, id, ifName string) bool {
	return recordfile.Exists(dirOf(dir), recordfile.Name(id, ifName))
}

// List returns every call kept under dir. Files that are not calls (a
// write in progress, or cut short: its DEL removes it) are left alone.
func List(dir string) ([]Call, error) {
	recs, _, err := recordfile.ReadAll[Call](dirOf(dir), "the intercept calls")
	out := make([]Call, 0, len(recs))
	for _, c := range recs {
		out = append(out, c)
	}
	return out, err
}

// Repairing tells whether this process is an ADD the node agent repeats.
func Repairing() bool { return os.Getenv(EnvRepair) == "1" }

func dirOf(dir string) string {
	if dir == "" {
		return Dir
	}
	return dir
}
