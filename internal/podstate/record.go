// Package podstate keeps meshwire's one record per pod on the node: what
// the intercept plugin learned and decided at the pod's ADD, and what the
// node agent did for the pod since. A record is one JSON file named after
// the attachment (Name: the container id and interface, as DEL names
// them) in the layout's pods directory (nodelayout.Layout.Pods).
//
// The plugin writes the record at ADD and removes it at DEL. The node
// agent reads it: its drift repair repeats the recorded call (Call), the
// fast path's replay puts the recorded policy back into a fast path just
// attached (Fastpath, Replay), ambient mode enrolls the pod by its names
// and annotations and records the enrollment (Ambient), and its sweep
// collects the records of namespaces gone without a DEL (Stale). A record
// written by a command killed at any instruction is whole or absent: a
// write is a temporary file renamed (package recordfile), and the DEL
// after a kill removes both.
//
// Earlier versions kept a pod's state in four stores (Migrate reads them
// once and moves what they hold here); the plugin's records of the pods'
// namespaces, the oldest of them, were in this directory already, in the
// format of a record without its sections.
package podstate

import (
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/recordfile"
)

// Record is one pod attachment's state on the node.
type Record struct {
	// The attachment as the runtime's ADD named it, and the identity of
	// the namespace its path led to then (a path that now leads
	// elsewhere, a name or a pid reused, is not this pod's).
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Netns       string `json:"netns"`
	NetnsIno    uint64 `json:"netnsIno"`
	NetnsDev    uint64 `json:"netnsDev"`
	// Network is the name of the network (the config's "name"), by which
	// the plugin's GC finds its own records; empty in records of earlier
	// versions.
	Network string `json:"network,omitempty"`

	// The Kubernetes pod, as the runtime told the plugin: CNI_ARGS'
	// names and uid, the interface plugin's addresses, and the pod's
	// annotations of Istio (keys with "istio.io/" in them: the rest can
	// be large, kubectl's last-applied configuration, and is not read).
	UID         string            `json:"uid,omitempty"`
	Namespace   string            `json:"namespace"`
	Name        string            `json:"name"`
	IPs         []netip.Addr      `json:"ips,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`

	// Call is the runtime's ADD of a pod whose interception the plugin
	// installed, which the node agent's drift repair repeats.
	Call *Call `json:"call,omitempty"`
	// Fastpath is the pod's fast-path policy, which a fast path attached
	// after the pod's ADD gets from Replay.
	Fastpath *Fastpath `json:"fastpath,omitempty"`
	// Ambient is the node agent's enrollment of the pod in Istio's
	// ambient mode; nil when it is not enrolled.
	Ambient *Enrollment `json:"ambient,omitempty"`
}

// Call is what the runtime's ADD gave the plugin beyond the attachment:
// its config (the plugin's stdin, prevResult included) and CNI_ARGS.
type Call struct {
	Args   string `json:"args,omitempty"`
	Config []byte `json:"config"`
}

// Fastpath is what the plugin decided for the pod about the fast path,
// under its namespace's cookie (never handed out twice: a record of a
// gone namespace writes entries no socket will ever match).
type Fastpath struct {
	Cookie uint64           `json:"netnsCookie"`
	Policy podpolicy.Policy `json:"policy"`
	// Mirror is the copy of its interception settings
	// (apply.MirrorOf); nil when the rules are not the plugin's (an
	// init container's).
	Mirror *pods.Settings `json:"mirror,omitempty"`
}

// Enrollment is the node agent's enrollment of the pod in ambient mode.
type Enrollment struct {
	// Why the pod is enrolled, for logs.
	Why string `json:"why,omitempty"`
	// Overrides are what the pod changes of the in-pod rules.
	Overrides ambient.Overrides `json:"overrides"`
	// UID and ServiceAccount are what ztunnel was told of the pod, with
	// its names.
	UID            string `json:"uid,omitempty"`
	ServiceAccount string `json:"serviceAccount,omitempty"`
	// Backend is the firewall the in-pod rules were written with.
	Backend string `json:"backend"`
	// IPs are the addresses put in the host's probe sets.
	IPs []netip.Addr `json:"ips,omitempty"`
}

// Name is a record's file name for the attachment of container id on
// interface ifName: one record per attachment, as DEL names it.
func Name(id, ifName string) string { return recordfile.Name(id, ifName) }

// File is r's file name (Name).
func (r Record) File() string { return Name(r.ContainerID, r.IfName) }

// Key names the pod in logs: namespace/name, else its container id.
func (r Record) Key() string {
	if r.Name == "" {
		return r.ContainerID
	}
	return r.Namespace + "/" + r.Name
}

// Kubernetes tells whether the record names a Kubernetes pod.
func (r Record) Kubernetes() bool { return r.Namespace != "" && r.Name != "" }

// Empty tells whether the record keeps nothing a reader acts on.
func (r Record) Empty() bool {
	return r.Call == nil && r.Fastpath == nil && r.Ambient == nil && !r.Kubernetes()
}

// Identify records the identity of the namespace r.Netns leads to.
func (r *Record) Identify() error {
	var err error
	if r.NetnsIno, r.NetnsDev, err = netns.Identify(r.Netns); err != nil {
		return fmt.Errorf("identify the pod's namespace: %w", err)
	}
	return nil
}

// Check tells whether r's namespace path still leads to the namespace
// recorded at ADD, and not to this process's own (netns.ErrNotThePod when
// not).
func (r Record) Check() error { return netns.CheckIdentity(r.Netns, r.NetnsIno, r.NetnsDev) }

// Open opens r's namespace, once it is checked to be the pod's: what the
// node agent hands to ztunnel.
func (r Record) Open() (*os.File, error) {
	f, err := os.Open(r.Netns)
	if err != nil {
		return nil, fmt.Errorf("open the namespace of pod %s: %w", r.Key(), err)
	}
	// Checked after the open, so that the file is the namespace checked.
	if err := netns.CheckIdentity(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), r.NetnsIno, r.NetnsDev); err != nil {
		f.Close()
		return nil, fmt.Errorf("pod %s: %w", r.Key(), err)
	}
	return f, nil
}

// IstioAnnotations keeps the annotations a record holds.
func IstioAnnotations(all map[string]string) map[string]string {
	var out map[string]string
	for k, v := range all {
		if strings.Contains(k, "istio.io/") {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// ValidName tells whether name can name a record: one path element, not
// a temporary file's (what the node agent's socket accepts from a client).
func ValidName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00\n") || strings.HasPrefix(name, ".") {
		return fmt.Errorf("%q names no record: a record's name is one path element", name)
	}
	return nil
}
