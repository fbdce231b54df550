// Package crigc runs the CNI GC of a node's network against the pod
// sandboxes its container runtime lists over CRI, as a runtime that calls
// GC does. containerd v2.4 calls STATUS but not GC, so an attachment whose
// DEL was lost stays until something does (`meshwire gc --cri-socket`, the
// node agent's --gc-cri-socket).
//
// # The race with ADDs, and the age rule
//
// A runtime's list is not the set of attachments to keep: containerd 2
// adds a sandbox to the list CRI answers only after its network is set up
// (RunPodSandbox calls sandboxStore.Add after setupPodNetwork), so an
// attachment whose ADD is under way is in no list, and a GC against the
// list alone would take its address. Without the runtime's lock (CRI-O
// holds its own), what tells such an attachment apart from a lost one is
// its age. Run takes the time, then lists the sandboxes; the attachments
// to keep are
//
//   - the listed sandboxes' (their ids on the runtime's interface, eth0,
//     and on every interface the node's stores know for those ids);
//   - every attachment the node's stores hold that was made after the
//     cutoff, min-age before the listing: the runtime's cache of results
//     (libcni's, /var/lib/cni/results: the time its ADD ended),
//     host-local's allocations of the network (the time of each, kept in
//     its store) and meshwire's pods' records (package podstate: the time
//     of the record's last write).
//
// Run DELs the cached attachments that are neither (libcni's own first
// step of a GC, done here with the age rule: a GC by libcni alone would
// DEL an attachment cached after the listing), then runs the network's GC
// through libcni's GCNetworkList with that valid list and, in every
// plugin's config, host-local's cutoff (hostlocal.GCAllocatedBefore):
// host-local applies it inside the transaction that releases, so an ADD
// that allocates after Run read the store keeps its address too.
//
// What the rule cannot see: an ADD that has run longer than min-age and
// is still not in the runtime's list (pick min-age above the runtime's
// CNI timeout), and the rules (masquerade, port mappings, shaping) of an
// ADD that starts after Run read the stores and sets them up before the
// plugins' GC reads its list, a window of milliseconds each run: the
// address stays (host-local's cutoff), the rule may go, and the next ADD
// of the pod (the agent's drift repair, for meshed pods) puts it back.
package crigc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/meshwire/meshwire/internal/hostlocal"
	hlconfig "github.com/meshwire/meshwire/internal/hostlocal/config"
	"github.com/meshwire/meshwire/internal/hostlocal/store"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podstate"
)

// Defaults of Options, as a node has them.
const (
	DefaultMinAge   = 2 * time.Minute
	DefaultIfName   = "eth0"
	DefaultConfDir  = "/etc/cni/net.d"
	DefaultCacheDir = "/var/lib/cni"
)

// Options are what Run needs.
type Options struct {
	// CRISocket is the runtime's CRI socket (a path, or unix://PATH).
	CRISocket string
	// MinAge: attachments made after the listing's time less MinAge are
	// kept. Zero keeps none for its age (unsafe: for tests).
	MinAge time.Duration
	// IfName is the interface the runtime gives a sandbox's network.
	IfName string
	// Networks are the conflists to GC (Network reads them).
	Networks []*libcni.NetworkConfigList
	// ConfDir is where a caller's Network finds the node's conflist (Run
	// does not read it).
	ConfDir string
	// CNIPath is where the plugins are.
	CNIPath []string
	// CacheDir is the runtime's libcni cache directory.
	CacheDir string
	// NodeState is where meshwire's pods' records are.
	NodeState nodelayout.Layout
	// Timeout bounds each CRI call and the wait for a host-local store.
	Timeout time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Seen is an attachment the node's stores hold.
type Seen struct {
	types.GCAttachment
	// Since is when it was made (as the store tells), zero when unknown.
	Since time.Time
	// Where is the store: "cache", "host-local" or "pod record".
	Where string
}

// NetworkReport is what Run did for one network.
type NetworkReport struct {
	Network string
	// Valid is the list the plugins' GC got.
	Valid []types.GCAttachment
	// Young are the attachments kept for their age alone.
	Young []Seen
	// Deleted are the cached attachments Run DELed.
	Deleted []Seen
	// PluginGC is false when the conflist's cniVersion is below 1.1.0:
	// its plugins have no GC, only the cached attachments were DELed.
	PluginGC bool
	// Disabled: the conflist says "disableGC", and nothing was done.
	Disabled bool
}

// Report is what Run did.
type Report struct {
	ListedAt  time.Time
	Cutoff    time.Time
	Sandboxes []string
	Networks  []NetworkReport
}

// Network reads the conflist at path as the runtime does (a .conflist, or
// a single plugin's .conf or .json), or, when path is empty, the first
// conflist of dir by name, the one containerd uses for its pods.
func Network(dir, path string) (*libcni.NetworkConfigList, string, error) {
	if path == "" {
		files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
		if err != nil {
			return nil, "", err
		}
		if len(files) == 0 {
			return nil, "", fmt.Errorf("no network config (.conflist, .conf, .json) in %s", dir)
		}
		sort.Strings(files)
		path = files[0]
	}
	if strings.HasSuffix(path, ".conflist") {
		l, err := libcni.NetworkConfFromFile(path)
		return l, path, err
	}
	c, err := libcni.ConfFromFile(path)
	if err != nil {
		return nil, path, err
	}
	if c.Network.Type == "" {
		return nil, path, fmt.Errorf("%s: no plugin type", path)
	}
	l, err := libcni.ConfListFromConf(c)
	return l, path, err
}

func (o *Options) defaults() {
	if o.IfName == "" {
		o.IfName = DefaultIfName
	}
	if o.CacheDir == "" {
		o.CacheDir = DefaultCacheDir
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// check refuses what Run could not finish, before anything changes.
func (o *Options) check() error {
	if o.MinAge < 0 {
		return fmt.Errorf("min-age is negative (%s)", o.MinAge)
	}
	if len(o.Networks) == 0 {
		return errors.New("no network to GC")
	}
	if _, err := SocketPath(o.CRISocket); err != nil {
		return err
	}
	ex := &invoke.DefaultExec{}
	for _, l := range o.Networks {
		for _, p := range l.Plugins {
			if _, err := ex.FindInPath(p.Network.Type, o.CNIPath); err != nil {
				return fmt.Errorf("network %s: plugin %s: %w", l.Name, p.Network.Type, err)
			}
		}
	}
	return nil
}

// SocketPath is the path of a CRI socket given as a path or unix://PATH;
// it must be a socket.
func SocketPath(s string) (string, error) {
	p := strings.TrimPrefix(s, "unix://")
	if p == "" {
		return "", errors.New("no CRI socket")
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return "", fmt.Errorf("%s is not a socket", p)
	}
	return p, nil
}

// Sandboxes lists the ids of the runtime's pod sandboxes over CRI, in
// any state: a sandbox the runtime knows keeps its network until the
// runtime itself tears it down.
func Sandboxes(ctx context.Context, socket string) ([]string, error) {
	p, err := SocketPath(socket)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("unix://"+p, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	l, err := runtimeapi.NewRuntimeServiceClient(conn).ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(l.Items))
	for _, sb := range l.Items {
		ids = append(ids, sb.Id)
	}
	sort.Strings(ids)
	return ids, nil
}

// Run lists the runtime's sandboxes and GCs every network of o against
// them (the package's doc). An error before the listing's end changes
// nothing; one during the GC of a network leaves the others to run.
func Run(ctx context.Context, o Options) (*Report, error) {
	o.defaults()
	if err := o.check(); err != nil {
		return nil, err
	}
	cni := libcni.NewCNIConfigWithCacheDir(o.CNIPath, o.CacheDir, nil)
	r := &Report{ListedAt: o.Now()}
	r.Cutoff = r.ListedAt.Add(-o.MinAge)
	lctx, cancel := context.WithTimeout(ctx, o.Timeout)
	ids, err := Sandboxes(lctx, o.CRISocket)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("list the pod sandboxes over CRI at %s: %w", o.CRISocket, err)
	}
	r.Sandboxes = ids
	listed := map[string]bool{}
	for _, id := range ids {
		listed[id] = true
	}
	cached, err := cni.GetCachedAttachments("")
	if err != nil {
		return nil, fmt.Errorf("read the runtime's CNI cache in %s: %w", o.CacheDir, err)
	}
	records, err := podstate.New(o.NodeState).List()
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, l := range o.Networks {
		nr, err := o.network(ctx, cni, l, listed, r.Cutoff, cached, records)
		r.Networks = append(r.Networks, nr)
		if err != nil {
			errs = append(errs, fmt.Errorf("network %s: %w", l.Name, err))
		}
	}
	return r, errors.Join(errs...)
}

// network GCs one network (Run).
func (o *Options) network(ctx context.Context, cni *libcni.CNIConfig, l *libcni.NetworkConfigList, listed map[string]bool, cutoff time.Time,
	cached []*libcni.NetworkAttachment, records map[string]podstate.Record,
) (NetworkReport, error) {
	nr := NetworkReport{Network: l.Name}
	if l.DisableGC {
		nr.Disabled = true // the conflist's "disableGC": no runtime GCs it
		return nr, nil
	}
	seen, cachedSeen, err := o.seen(l, cni, cached, records)
	if err != nil {
		return nr, err
	}
	valid := map[types.GCAttachment]bool{}
	for id := range listed {
		valid[types.GCAttachment{ContainerID: id, IfName: o.IfName}] = true
	}
	young := map[types.GCAttachment]bool{}
	for _, s := range seen {
		switch {
		case listed[s.ContainerID]:
			valid[s.GCAttachment] = true
		case s.Since.After(cutoff):
			valid[s.GCAttachment] = true
			if !young[s.GCAttachment] {
				young[s.GCAttachment] = true
				nr.Young = append(nr.Young, s)
			}
		}
	}
	for a := range valid {
		nr.Valid = append(nr.Valid, a)
	}
	sort.Slice(nr.Valid, func(i, j int) bool {
		return nr.Valid[i].ContainerID+"/"+nr.Valid[i].IfName < nr.Valid[j].ContainerID+"/"+nr.Valid[j].IfName
	})
	var errs []error
	for _, c := range cachedSeen {
		if valid[c.seen.GCAttachment] {
			continue
		}
		rt := &libcni.RuntimeConf{ContainerID: c.att.ContainerID, NetNS: c.att.NetNS, IfName: c.att.IfName, Args: c.att.CniArgs, CapabilityArgs: c.att.CapabilityArgs}
		if err := cni.DelNetworkList(ctx, l, rt); err != nil {
			errs = append(errs, fmt.Errorf("DEL of the stale attachment %s %s: %w", rt.ContainerID, rt.IfName, err))
			continue
		}
		nr.Deleted = append(nr.Deleted, c.seen)
	}
	nr.PluginGC, _ = version.GreaterThanOrEqualTo(l.CNIVersion, "1.1.0")
	if nr.PluginGC {
		errs = append(errs, o.pluginGC(ctx, l, nr.Valid, cutoff))
	}
	return nr, errors.Join(errs...)
}

// pluginGC runs the plugins' GC through libcni's GCNetworkList, with an
// empty cache (the cached attachments were judged by their age already)
// and host-local's cutoff in every plugin's config.
func (o *Options) pluginGC(ctx context.Context, l *libcni.NetworkConfigList, valid []types.GCAttachment, cutoff time.Time) error {
	gl := *l
	gl.Plugins = nil
	for _, p := range l.Plugins {
		ip, err := libcni.InjectConf(p, map[string]any{hostlocal.GCAllocatedBefore: cutoff.UTC().Format(time.RFC3339Nano)})
		if err != nil {
			return err
		}
		gl.Plugins = append(gl.Plugins, ip)
	}
	noCache := filepath.Join(os.TempDir(), fmt.Sprintf("meshwire-gc-no-cache-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if valid == nil {
		valid = []types.GCAttachment{}
	}
	return libcni.NewCNIConfigWithCacheDir(o.CNIPath, noCache, nil).GCNetworkList(ctx, &gl, &libcni.GCArgs{ValidAttachments: valid})
}

type cachedAttachment struct {
	att  *libcni.NetworkAttachment
	seen Seen
}

// seen returns the attachments of network l the node's stores hold, with
// their times, and the cached ones apart.
func (o *Options) seen(l *libcni.NetworkConfigList, cni *libcni.CNIConfig, cached []*libcni.NetworkAttachment, records map[string]podstate.Record) ([]Seen, []cachedAttachment, error) {
	var out []Seen
	var cachedOut []cachedAttachment
	for _, a := range cached {
		if a.Network != l.Name {
			continue
		}
		s := Seen{GCAttachment: types.GCAttachment{ContainerID: a.ContainerID, IfName: a.IfName}, Where: "cache"}
		if fi, err := os.Stat(filepath.Join(o.CacheDir, "results", a.Network+"-"+a.ContainerID+"-"+a.IfName)); err == nil {
			s.Since = fi.ModTime()
		}
		out = append(out, s)
		cachedOut = append(cachedOut, cachedAttachment{att: a, seen: s})
	}
	allocs, err := o.hostLocal(l)
	if err != nil {
		return nil, nil, err
	}
	for _, a := range allocs {
		ifName := a.Owner.IfName
		if ifName == "" { // a reference file of a version that kept the id alone
			ifName = o.IfName
		}
		out = append(out, Seen{GCAttachment: types.GCAttachment{ContainerID: a.Owner.ID, IfName: ifName}, Since: a.Since, Where: "host-local"})
	}
	for name, r := range records {
		if r.Network != "" && r.Network != l.Name {
			continue
		}
		s := Seen{GCAttachment: types.GCAttachment{ContainerID: r.ContainerID, IfName: r.IfName}, Where: "pod record"}
		if fi, err := os.Stat(filepath.Join(o.NodeState.Pods(), name)); err == nil {
			s.Since = fi.ModTime()
		}
		out = append(out, s)
	}
	return out, cachedOut, nil
}

// hostLocal reads the allocations of every host-local store of network
// l, read-only: the ipam of each plugin whose ipam type is host-local.
func (o *Options) hostLocal(l *libcni.NetworkConfigList) ([]store.Allocation, error) {
	var out []store.Allocation
	done := map[string]bool{}
	for _, p := range l.Plugins {
		var conf struct {
			IPAM struct {
				Type string `json:"type"`
			} `json:"ipam"`
		}
		if json.Unmarshal(p.Bytes, &conf) != nil || conf.IPAM.Type != "host-local" {
			continue
		}
		ip, err := libcni.InjectConf(p, map[string]any{"name": l.Name, "cniVersion": l.CNIVersion})
		if err != nil {
			return nil, err
		}
		c, err := hlconfig.Load(ip.Bytes, "")
		if err != nil {
			return nil, fmt.Errorf("plugin %s's host-local config: %w", p.Network.Type, err)
		}
		db := filepath.Join(store.Dir(c.DataDir, c.Network), store.DBName)
		if done[db] {
			continue
		}
		done[db] = true
		if _, err := os.Stat(db); errors.Is(err, os.ErrNotExist) {
			continue
		}
		as, err := store.ReadAll(db, o.Timeout)
		if err != nil {
			return nil, err
		}
		out = append(out, as...)
	}
	return out, nil
}

// Write prints r for a person.
func (r *Report) Write(w io.Writer, minAge time.Duration) {
	fmt.Fprintf(w, "listed %d pod sandboxes over CRI at %s; kept what was made after %s (min-age %s)\n",
		len(r.Sandboxes), r.ListedAt.UTC().Format(time.RFC3339Nano), r.Cutoff.UTC().Format(time.RFC3339Nano), minAge)
	for _, n := range r.Networks {
		if n.Disabled {
			fmt.Fprintf(w, "network %s: not collected (its conflist says disableGC)\n", n.Network)
			continue
		}
		fmt.Fprintf(w, "network %s: %d valid attachments, %d of them for their age alone", n.Network, len(n.Valid), len(n.Young))
		for _, y := range n.Young {
			fmt.Fprintf(w, " (%s %s, %s, %s)", short(y.ContainerID), y.IfName, y.Where, y.Since.UTC().Format(time.RFC3339Nano))
		}
		fmt.Fprintf(w, "; %d stale cached attachments deleted", len(n.Deleted))
		for _, d := range n.Deleted {
			fmt.Fprintf(w, " (%s %s)", short(d.ContainerID), d.IfName)
		}
		if n.PluginGC {
			fmt.Fprintln(w, "; the plugins' GC run")
		} else {
			fmt.Fprintln(w, "; no plugin GC (cniVersion below 1.1.0)")
		}
	}
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
