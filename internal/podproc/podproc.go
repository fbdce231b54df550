// Package podproc finds a Kubernetes pod's network namespace and sandbox
// through the pod's processes, for a pod that has no record on the node
// (package podstate): one that started before the node agent's ambient
// mode was on.
package podproc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"

	"github.com/meshwire/meshwire/internal/netns"
)

// A pod that started before the agent's ambient mode was on has no record:
// its ADD wrote none. Find locates its namespace the way istio-cni's node
// agent does, through the pod's processes: a process is the pod's when its
// cgroup is named after the pod's uid (kubelet's pod cgroup: "pod<uid>"
// with the cgroupfs driver, "...-pod<uid with _>.slice" with systemd's) or
// after one of the pod's containers, as the API server's status lists
// them (the container's own cgroup, also where kubelet makes no pod
// cgroups: cgroupsPerQOS false). The pod's sandbox is the first process
// started in that namespace (the runtime starts the sandbox before any of
// the pod's containers), and its id is its cgroup's name. The agent runs
// with the host's pid namespace and the runtime's netns directory (the
// DaemonSet's hostPID and /var/run/netns mount).

// ProcDir and NetnsDirs are where Find looks: the processes, and the
// directories where runtimes bind-mount pods' namespaces (the path the
// runtime's ADD gave, CNI_NETNS). Tests point them elsewhere.
var (
	ProcDir   = "/proc"
	NetnsDirs = []string{"/var/run/netns", "/run/netns"}
)

// ErrNotFound: no process of the pod runs in a namespace under NetnsDirs
// (no process, a host-network pod, or a runtime that keeps its namespaces
// elsewhere).
var ErrNotFound = errors.New("no process of the pod in a namespace the runtime mounted")

// Found is a pod's attachment as Find finds it: the namespace's path and
// the pod's sandbox.
type Found struct {
	Netns       string
	ContainerID string
}

// process is what Find reads of one process.
type process struct {
	ns      [2]uint64 // the network namespace's inode and device
	start   uint64    // clock ticks after boot
	cgroups []procfs.Cgroup
}

// Processes are the node's processes and the namespaces the runtime
// mounted, read once (ReadProcesses) to find several pods.
type Processes struct {
	procs   []process
	mounted map[[2]uint64]string
}

// ReadProcesses reads every process's namespace, start time and cgroups,
// and the namespaces under NetnsDirs.
func ReadProcesses() (*Processes, error) {
	mounted := mountedNetns()
	procs, err := processes(mounted)
	if err != nil {
		return nil, fmt.Errorf("read the processes: %w", err)
	}
	return &Processes{procs: procs, mounted: mounted}, nil
}

// Find finds the namespace and sandbox of the pod with uid and the
// containers containerIDs through its processes, reading them
// (ReadProcesses: for several pods, read once).
func Find(uid string, containerIDs []string) (Found, error) {
	ps, err := ReadProcesses()
	if err != nil {
		return Found{}, fmt.Errorf("find the namespace of pod %s: %w", uid, err)
	}
	return ps.Find(uid, containerIDs)
}

// Find finds the namespace and sandbox of the pod with uid and the
// containers containerIDs among ps.
func (ps *Processes) Find(uid string, containerIDs []string) (Found, error) {
	if uid == "" || strings.ContainsAny(uid, "/\n") {
		return Found{}, fmt.Errorf("find a pod's namespace: bad uid %q", uid)
	}
	path := ""
	var ns [2]uint64
	for _, p := range ps.procs {
		if where, ok := ps.mounted[p.ns]; ok && ofPod(p.cgroups, uid, containerIDs) {
			path, ns = where, p.ns
			break
		}
	}
	if path == "" {
		return Found{}, fmt.Errorf("pod %s: %w", uid, ErrNotFound)
	}
	var first *process
	for i, p := range ps.procs {
		if p.ns == ns && (first == nil || p.start < first.start) {
			first = &ps.procs[i]
		}
	}
	return Found{Netns: path, ContainerID: leaf(first.cgroups)}, nil
}

// processes reads the namespace of every process and, for those in a
// namespace of mounted (the host's own processes are not), its start time
// and cgroups; those that end meanwhile, or that cannot be read, are left
// out.
func processes(mounted map[[2]uint64]string) ([]process, error) {
	fs, err := procfs.NewFS(ProcDir)
	if err != nil {
		return nil, err
	}
	all, err := fs.AllProcs()
	if err != nil {
		return nil, err
	}
	var out []process
	for _, p := range all {
		ino, dev, err := netns.Identify(filepath.Join(ProcDir, strconv.Itoa(p.PID), "ns", "net"))
		if err != nil {
			continue
		}
		if _, ok := mounted[[2]uint64{ino, dev}]; !ok {
			continue
		}
		st, err := p.Stat()
		if err != nil {
			continue
		}
		cgroups, err := p.Cgroups()
		if err != nil {
			continue
		}
		out = append(out, process{ns: [2]uint64{ino, dev}, start: st.Starttime, cgroups: cgroups})
	}
	return out, nil
}

// mountedNetns maps each namespace bind-mounted under NetnsDirs to its
// path (the first directory's, when two lead to one: /var/run is /run).
func mountedNetns() map[[2]uint64]string {
	out := map[[2]uint64]string{}
	for _, dir := range NetnsDirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			path := filepath.Join(dir, e.Name())
			ino, dev, err := netns.Identify(path)
			if err != nil {
				continue
			}
			if _, seen := out[[2]uint64{ino, dev}]; !seen {
				out[[2]uint64{ino, dev}] = path
			}
		}
	}
	return out
}

// ofPod tells whether a process in cgroups is the pod's: in a cgroup
// named after its uid, or after one of its containers. Any hierarchy will
// do.
func ofPod(cgroups []procfs.Cgroup, uid string, containerIDs []string) bool {
	names := []string{"pod" + uid, "pod" + strings.ReplaceAll(uid, "-", "_")}
	for _, cg := range cgroups {
		for _, el := range strings.Split(cg.Path, "/") {
			if slices.Contains(containerIDs, containerOf(el)) {
				return true
			}
			el = strings.TrimSuffix(el, ".slice")
			for _, n := range names {
				if el == n || strings.HasSuffix(el, "-"+n) {
					return true
				}
			}
		}
	}
	return false
}

// leaf is the container id of a process in cgroups: the name of its
// cgroup in the unified hierarchy (else the first one), a systemd scope's
// "cri-containerd-" or "crio-" prefix and ".scope" suffix taken off.
func leaf(cgroups []procfs.Cgroup) string {
	path := ""
	for _, cg := range cgroups {
		if path == "" || cg.HierarchyID == 0 {
			path = cg.Path
		}
	}
	return containerOf(path[strings.LastIndex(path, "/")+1:])
}

// containerOf is the container id a cgroup's name carries: the name, or
// a systemd scope's without its runtime prefix and suffix.
func containerOf(name string) string {
	if scope, ok := strings.CutSuffix(name, ".scope"); ok {
		return scope[strings.LastIndex(scope, "-")+1:]
	}
	return name
}
