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
	"os"

	"github.com/meshwire/meshwire/internal/recordfile"
)

// Dir is where the calls are kept, beside the fast path's records, in the
// directory the node agent's DaemonSet mounts.
const Dir = "/var/lib/cni/meshwire/intercept"

// EnvRepair is set to "1" in the environment of an ADD the node agent
// repeats: the plugin then does nothing when the pod's call is gone (its
// DEL ran meanwhile), and writes no record.
const EnvRepair = "MESHWIRE_REPAIR"

// Call is the runtime's ADD of one pod's attachment.
type Call struct {
	ContainerID string `json:"containerID"`
	Netns       string `json:"netns"`
	IfName      string `json:"ifName"`
	Args        string `json:"args,omitempty"`
	// Config is the plugin's stdin, prevResult included.
	Config []byte `json:"config"`
}

// Name is the record's file name (one per attachment).
func (c Call) Name() string { return recordfile.Name(c.ContainerID, c.IfName) }

const what = "the pod's intercept call"

// Write keeps c under dir (Dir when empty).
func Write(dir string, c Call) error { return recordfile.Write(dirOf(dir), c.Name(), what, c) }

// Remove removes the call of container id on ifName; none is not an error.
func Remove(dir, id, ifName string) error {
	return recordfile.Remove(dirOf(dir), recordfile.Name(id, ifName), what)
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
