// Package fastpath loads, attaches, pins, drains and reports meshwire's eBPF
// sockmap fast path (the programs are in fastpath.c; see its header for how
// connections are chosen and paired). `meshwire fastpath` drives it.
//
// Attach loads the programs, attaches sk_msg to the sockhash and sockops to
// the cgroup v2 root, and pins the sockops link and the maps status and
// detach need under PinDir, so that the fast path outlives the command.
// Detach turns the programs into pass-through (draining), removes the
// sockops attachment and every pin; sockets already on the fast path keep
// it until they close, with the bytes it queued for them, and nothing in
// user space needs to stay behind: each socket's psock holds the sk_msg
// program, which holds the sockhash it redirects through, so the kernel
// keeps the sockhash while any socket is in it and frees it after the last
// one closes (TestFastpathDetachKeepsQueuedBytes).
package fastpath

import (
	"fmt"

	"github.com/meshwire/meshwire/ebpf/loader"
)

// LayoutVersion names the layout of the pinned objects; a program or map
// change that an older meshwire could not read bumps it.
const LayoutVersion = loader.FastpathLayoutVersion

// DefaultPinDir is where Attach pins, under bpffs.
const DefaultPinDir = loader.FastpathPinDir

// captureSockopsName is the sockops program of meshwire's ebpf
// interception (../capture/capture.c), attached beside the fast path's: it only
// files original destinations, never redirects.
const captureSockopsName = "mw_cap_ops"

// Names of the pinned objects, under the pin directory.
const (
	pinLink     = "sockops_link"
	pinSocks    = "socks"
	pinCounters = "counters"
	pinControl  = "control"
	pinPods     = loader.PinPolicies
)

// Config is what attach is given.
type Config struct {
	ProxyUID uint32 // the sidecar's uid (iptables-init's --proxy-uid)
	// ProxyGID, when set, makes sockets of that gid the sidecar's too
	// (iptables-init's --proxy-gid), whatever their uid.
	ProxyGID     *uint32
	OutboundPort uint16 // the sidecar's outbound capture port
	IntoProxy    bool   // also redirect the app's bytes into the proxy's sockets
	PinDir       string // default DefaultPinDir
	Cgroup       string // cgroup v2 directory; default: the cgroup2 mount
}

// Defaults are istio's: uid 1337, outbound capture on 15001.
func Defaults() Config {
	return Config{ProxyUID: 1337, OutboundPort: 15001, PinDir: DefaultPinDir}
}

func (c *Config) pinDir() string {
	if c.PinDir == "" {
		return DefaultPinDir
	}
	return c.PinDir
}

func sameGID(a, b *uint32) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// describeGID names a proxy gid setting for messages.
func describeGID(g *uint32) string {
	if g == nil {
		return "none"
	}
	return fmt.Sprint(*g)
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
