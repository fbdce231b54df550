// Package killpoint is the fault-injection hook of meshwire's crash tests.
// A command passes named points as it works (Here); when its environment
// names one in MESHWIRE_KILL_AT, the process kills itself there with
// SIGKILL, as an OOM kill, a node's shutdown or a runtime's timeout would:
// no deferred function runs, nothing is undone. The crash tests kill every
// plugin at each of its points and check that what a runtime does next
// (DEL, GC) leaves nothing behind. Outside those tests the variable is
// unset and a point costs one comparison.
package killpoint

import (
	"os"
	"syscall"
)

// Env is the variable naming the point to die at: "PLUGIN:COMMAND:POINT"
// for a CNI plugin (bridge:ADD:veth), "iptables-init:POINT" for
// iptables-init.
const Env = "MESHWIRE_KILL_AT"

var (
	at     = os.Getenv(Env)
	prefix string
)

// SetCommand names the command points belong to ("bridge:ADD"):
// cniplugin does it for every plugin.
func SetCommand(name string) {
	if at != "" {
		prefix = name + ":"
	}
}

// Here is a point: the process dies here when Env names it.
func Here(point string) {
	if at != "" && at == prefix+point {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
