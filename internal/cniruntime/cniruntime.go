// Package cniruntime wires named network namespaces with conflists through
// libcni, the way a container runtime does, and keeps what it did on disk so
// that CHECK, DEL and GC work later from another process.
//
// A pod here is a named network namespace. Its record lists the attachments
// made for it, in order: the loopback network on "lo" (as containerd and
// CRI-O do) unless the conflist is loopback only, then the conflist on the
// pod interface. libcni's own cache (results, configs) lives under the state
// directory too, so the state of meshwire is one directory.
package cniruntime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/meshwire/meshwire/internal/filelock"
	"github.com/meshwire/meshwire/internal/netns"
)

// loopbackConflist is the network every pod gets on "lo" before its own
// conflist, as container runtimes do.
const loopbackConflist = `{"cniVersion":"1.1.0","name":"meshwire-loopback","plugins":[{"type":"loopback"}]}`

// Attachment is one conflist run on one interface of a pod.
type Attachment struct {
	Network  string          `json:"network"`
	IfName   string          `json:"ifName"`
	Conflist json.RawMessage `json:"conflist"`
}

// Record is what meshwire remembers of a pod.
type Record struct {
	Name           string         `json:"name"`
	ContainerID    string         `json:"containerID"`
	NetNS          string         `json:"netns"`
	CreatedNetNS   bool           `json:"createdNetns"`
	CapabilityArgs map[string]any `json:"capabilityArgs,omitempty"`
	// Args are the CNI_ARGS every call for the pod gets (a Kubernetes
	// runtime's K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_UID).
	Args        [][2]string  `json:"args,omitempty"`
	Attachments []Attachment `json:"attachments"`
	Created     time.Time    `json:"created"`
}

// Runtime holds the libcni config and the state directory.
type Runtime struct {
	StateDir string
	CNIPath  []string
	CNI      *libcni.CNIConfig
}

// New returns a runtime keeping its state in stateDir and finding plugins in
// cniPath.
func New(stateDir string, cniPath []string) *Runtime {
	return &Runtime{
		StateDir: stateDir,
		CNIPath:  cniPath,
		CNI:      libcni.NewCNIConfigWithCacheDir(cniPath, filepath.Join(stateDir, "cache"), nil),
	}
}

func (r *Runtime) recordPath(name string) string {
	return filepath.Join(r.StateDir, "pods", name+".json")
}

// lock serializes changes to the state of one runtime directory.
func (r *Runtime) lock() (*filelock.Lock, error) {
	return filelock.Acquire(filepath.Join(r.StateDir, "lock"), 30*time.Second)
}

// IsLoopbackOnly reports whether every plugin of the list is loopback: such a
// list is attached on "lo" and needs no separate loopback network.
func IsLoopbackOnly(list *libcni.NetworkConfigList) bool {
	for _, p := range list.Plugins {
		if p.Network.Type != "loopback" {
			return false
		}
	}
	return len(list.Plugins) > 0
}

// Plan returns the attachments a pod gets for a conflist on ifName.
func Plan(conflist []byte, ifName string) ([]Attachment, error) {
	list, err := libcni.ConfListFromBytes(conflist)
	if err != nil {
		return nil, fmt.Errorf("conflist: %w", err)
	}
	if IsLoopbackOnly(list) {
		return []Attachment{{Network: list.Name, IfName: "lo", Conflist: conflist}}, nil
	}
	return []Attachment{
		{Network: "meshwire-loopback", IfName: "lo", Conflist: json.RawMessage(loopbackConflist)},
		{Network: list.Name, IfName: ifName, Conflist: conflist},
	}, nil
}

// Add creates (or adopts) the namespace and runs every attachment's ADD. On
// failure it undoes what it did (DEL of what was added, the namespace if it
// created it) and returns the error. args are the pod's CNI_ARGS, kept in
// its record for CHECK and DEL.
func (r *Runtime) Add(ctx context.Context, name string, conflist []byte, ifName string, caps map[string]any, args ...[2]string) (*Record, []types.Result, error) {
	if err := netns.ValidName(name); err != nil {
		return nil, nil, err
	}
	atts, err := Plan(conflist, ifName)
	if err != nil {
		return nil, nil, err
	}
	l, err := r.lock()
	if err != nil {
		return nil, nil, err
	}
	defer l.Release()
	if _, err := os.Stat(r.recordPath(name)); err == nil {
		return nil, nil, fmt.Errorf("%s is already wired by meshwire; run `meshwire del %s` first", name, name)
	}
	path, err := netns.Create(name)
	created := err == nil
	if err != nil && !errors.Is(err, netns.ErrExists) {
		return nil, nil, fmt.Errorf("create network namespace %s: %w", name, err)
	}
	rec := &Record{Name: name, ContainerID: newContainerID(), NetNS: path, CreatedNetNS: created, CapabilityArgs: caps, Args: args, Created: time.Now().UTC()}
	var results []types.Result
	for _, a := range atts {
		list, rt, err := r.prepare(rec, a)
		if err != nil {
			r.undo(rec)
			return nil, nil, err
		}
		res, err := r.CNI.AddNetworkList(ctx, list, rt)
		if err != nil {
			rec.Attachments = append(rec.Attachments, a) // DEL it too: ADD may have half-happened
			r.undo(rec)
			return nil, nil, fmt.Errorf("network %s on %s: %w", a.Network, a.IfName, err)
		}
		rec.Attachments = append(rec.Attachments, a)
		results = append(results, res)
	}
	if err := r.save(rec); err != nil {
		r.undo(rec)
		return nil, nil, err
	}
	return rec, results, nil
}

func (r *Runtime) undo(rec *Record) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = r.delAttachments(ctx, rec)
	if rec.CreatedNetNS {
		_ = netns.DeletePath(rec.NetNS)
	}
}

func (r *Runtime) prepare(rec *Record, a Attachment) (*libcni.NetworkConfigList, *libcni.RuntimeConf, error) {
	list, err := libcni.ConfListFromBytes(a.Conflist)
	if err != nil {
		return nil, nil, fmt.Errorf("conflist of network %s: %w", a.Network, err)
	}
	return list, &libcni.RuntimeConf{
		ContainerID:    rec.ContainerID,
		NetNS:          rec.NetNS,
		IfName:         a.IfName,
		CapabilityArgs: rec.CapabilityArgs,
		Args:           rec.Args,
	}, nil
}

// each runs fn for every attachment of the pod (last first when reverse),
// with its conflist and runtime config, and joins the errors.
func (r *Runtime) each(rec *Record, reverse bool, fn func(*libcni.NetworkConfigList, *libcni.RuntimeConf) error) error {
	var errs []error
	for i := range rec.Attachments {
		a := rec.Attachments[i]
		if reverse {
			a = rec.Attachments[len(rec.Attachments)-1-i]
		}
		list, rt, err := r.prepare(rec, a)
		if err == nil {
			err = fn(list, rt)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("network %s on %s: %w", a.Network, a.IfName, err))
		}
	}
	return errors.Join(errs...)
}

// Check runs CHECK of every attachment of the pod.
func (r *Runtime) Check(ctx context.Context, name string) error {
	rec, err := r.Get(name)
	if err != nil {
		return err
	}
	return r.each(rec, false, func(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
		return r.CNI.CheckNetworkList(ctx, list, rt)
	})
}

// Del runs DEL of every attachment (last first), removes the namespace if
// meshwire created it, and forgets the pod. DEL errors keep the record so the
// user can retry.
func (r *Runtime) Del(ctx context.Context, name string) (*Record, error) {
	l, err := r.lock()
	if err != nil {
		return nil, err
	}
	defer l.Release()
	rec, err := r.Get(name)
	if err != nil {
		return nil, err
	}
	if err := r.delAttachments(ctx, rec); err != nil {
		return rec, err
	}
	if rec.CreatedNetNS {
		if err := netns.DeletePath(rec.NetNS); err != nil {
			return rec, fmt.Errorf("remove network namespace %s: %w", name, err)
		}
	}
	if err := os.Remove(r.recordPath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return rec, err
	}
	return rec, nil
}

func (r *Runtime) delAttachments(ctx context.Context, rec *Record) error {
	return r.each(rec, true, func(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
		return r.CNI.DelNetworkList(ctx, list, rt)
	})
}

// GC runs CNI GC for every network meshwire knows (those of its pods plus
// extra conflists), with the pods' attachments as the valid ones. libcni first
// DELs cached attachments that are not valid, then asks each plugin to GC.
func (r *Runtime) GC(ctx context.Context, extra ...[]byte) ([]string, error) {
	recs, err := r.List()
	if err != nil {
		return nil, err
	}
	networks := map[string][]byte{}
	valid := map[string][]types.GCAttachment{}
	for _, c := range extra {
		atts, err := Plan(c, "eth0")
		if err != nil {
			return nil, err
		}
		for _, a := range atts {
			networks[a.Network] = a.Conflist
		}
	}
	for _, rec := range recs {
		for _, a := range rec.Attachments {
			networks[a.Network] = a.Conflist
			valid[a.Network] = append(valid[a.Network], types.GCAttachment{ContainerID: rec.ContainerID, IfName: a.IfName})
		}
	}
	var names []string
	var errs []error
	for n := range networks {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		list, err := libcni.ConfListFromBytes(networks[n])
		keep := valid[n]
		if keep == nil {
			keep = []types.GCAttachment{} // none valid: an empty list, never a missing one
		}
		if err == nil {
			err = r.CNI.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: keep})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("network %s: %w", n, err))
		}
	}
	return names, errors.Join(errs...)
}

// Get returns the record of a pod.
func (r *Runtime) Get(name string) (*Record, error) {
	b, err := os.ReadFile(r.recordPath(name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s is not wired by meshwire (see `meshwire ls`)", name)
	}
	if err != nil {
		return nil, err
	}
	var rec Record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("state of %s is corrupt (%s): %w", name, r.recordPath(name), err)
	}
	return &rec, nil
}

// List returns every pod record, sorted by name.
func (r *Runtime) List() ([]*Record, error) {
	ents, err := os.ReadDir(filepath.Join(r.StateDir, "pods"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*Record
	for _, e := range ents {
		if filepath.Ext(e.Name()) != ".json" {
			continue
		}
		rec, err := r.Get(e.Name()[:len(e.Name())-len(".json")])
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// save writes the record atomically (temp file + rename).
func (r *Runtime) save(rec *Record) error {
	p := r.recordPath(rec.Name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// Result returns the cached result of an attachment, in the current form.
func (r *Runtime) Result(rec *Record, a Attachment) (*current.Result, error) {
	list, rt, err := r.prepare(rec, a)
	if err != nil {
		return nil, err
	}
	res, err := r.CNI.GetNetworkListCachedResult(list, rt)
	if err != nil || res == nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

func newContainerID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
