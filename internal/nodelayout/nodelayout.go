// Package nodelayout says where meshwire keeps its state on a node: every
// directory, file and socket the plugins, the node agent and the meshwire
// command keep there, and the environment variables that move them (tests,
// `meshwire demo`). The BPF programs' pins are ebpf/loader's (layout.go);
// everything else is here, so that a reader of the node's state (the
// agent's drift repair, the fast path's replay, ambient mode, GC) and its
// writers (the intercept plugin) agree on one layout.
//
// A layout change keeps the old paths here, named Legacy*, for as long as
// a node upgraded in place may still hold them: the new agent reads them
// once and moves what they hold (package podstate), and the plugin's DEL
// removes what an older plugin's ADD wrote there.
package nodelayout

import (
	"os"
	"path/filepath"
)

// StateDir is the root of what meshwire keeps about pods on the node,
// beside the other plugins' state in /var/lib/cni (which the node agent's
// DaemonSet mounts). EnvNodeStateDir moves it.
const StateDir = "/var/lib/cni/meshwire"

// EnvNodeStateDir, in the environment of the intercept plugin (and of
// the commands that run it, as `meshwire demo` does), replaces StateDir:
// the node agent's --node-state-dir says the same to the agent.
const EnvNodeStateDir = "MESHWIRE_NODE_STATE_DIR"

// EnvRepair is set to "1" in the environment of an ADD the node agent
// repeats to repair a pod's interception (see package podstate).
const EnvRepair = "MESHWIRE_REPAIR"

// Layout is the node's state under one root.
type Layout struct{ Root string }

// Default is the layout under StateDir.
func Default() Layout { return Layout{Root: StateDir} }

// FromEnv is the layout under EnvNodeStateDir when it is set, else Default.
func FromEnv() Layout {
	if d := os.Getenv(EnvNodeStateDir); d != "" {
		return Layout{Root: d}
	}
	return Default()
}

// At is the layout under root, Default when root is empty.
func At(root string) Layout {
	if root == "" {
		return Default()
	}
	return Layout{Root: root}
}

// Pods is the directory of the pods' records: one file per pod
// attachment (package podstate).
func (l Layout) Pods() string { return filepath.Join(l.Root, "pods") }

// Ambient is the directory of ambient mode's socket.
func (l Layout) Ambient() string { return filepath.Join(l.Root, "ambient") }

// AgentSocket is where the node agent answers the intercept plugin when
// its ambient mode is on (none: it is off).
func (l Layout) AgentSocket() string { return filepath.Join(l.Ambient(), "agent.sock") }

// The stores of earlier versions, one per concern, which the pods'
// records replaced: the intercept plugin's calls (drift repair), its
// fast-path records, and the ambient agent's enrolled pods. (The plugin's
// records of the pods' namespaces were in Pods already, in a format the
// pods' records read as theirs.)

// LegacyCalls is where the intercept plugin kept each meshed pod's ADD.
func (l Layout) LegacyCalls() string { return filepath.Join(l.Root, "intercept") }

// LegacyFastpath is where the intercept plugin kept each pod's fast-path
// policy.
func (l Layout) LegacyFastpath() string { return filepath.Join(l.Root, "fastpath") }

// LegacyEnrolled is where the node agent kept the pods it enrolled in
// ambient mode.
func (l Layout) LegacyEnrolled() string { return filepath.Join(l.Ambient(), "enrolled") }

// Legacy lists the directories of the earlier stores.
func (l Layout) Legacy() []string {
	return []string{l.LegacyCalls(), l.LegacyFastpath(), l.LegacyEnrolled()}
}

// What the node keeps on tmpfs, gone at reboot.
const (
	// RunDir holds the plugins' node-wide caches and locks.
	RunDir = "/run/meshwire"
	// FirewallBackendCache remembers the firewall backend detected for
	// the host's network namespace (package firewall).
	FirewallBackendCache = RunDir + "/firewall-backend"
	// PortmapDir holds portmap's node-wide lock and its hints.
	PortmapDir = RunDir + "/portmap"
	// DemoDir is `meshwire demo`'s own state, apart from the node's.
	DemoDir = "/run/meshwire-demo"
)

// LegacyFirewallBackendCaches are where earlier versions cached the same
// detection (ipmasq and portmap kept one each): read, never written.
var LegacyFirewallBackendCaches = []string{RunDir + "/ipmasq-backend", PortmapDir + "/backend"}

// CommandDir is where the meshwire command keeps its records of the
// namespaces it wired, as a runtime keeps its own (its --state-dir).
const CommandDir = "/var/lib/meshwire"

// ZtunnelSocket is where the node's ztunnel looks for the node agent
// (Istio's path).
const ZtunnelSocket = "/var/run/ztunnel/ztunnel.sock"

// EnvPluginLog and EnvPluginLogLevel turn a plugin's log on when its
// config has none (package logging): the file, and its level.
const (
	EnvPluginLog      = "MESHWIRE_LOG"
	EnvPluginLogLevel = "MESHWIRE_LOG_LEVEL"
)

// Modes of what the node keeps: its records and sockets are root's alone
// (they name the pods' namespaces, and the agent's socket acts on them).
const (
	DirMode    os.FileMode = 0o700
	RecordMode os.FileMode = 0o600
	SocketMode os.FileMode = 0o600
)
