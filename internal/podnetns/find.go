package podnetns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"

	"github.com/meshwire/meshwire/internal/netns"
)

// A pod that started before the agent's ambient mode was on has no record:
// its ADD wrote none. Find locates its namespace the way istio-cni's node
// agent does, through the pod's processes: kubelet puts every container of
// a pod in a cgroup named after the pod's uid ("pod<uid>" with the
// cgroupfs driver, "...-pod<uid with _>.slice" with systemd's), and each
// container in a cgroup below it named after the container's id. The
// agent runs with the host's pid namespace and the runtime's netns
// directory (the DaemonSet's hostPID and /var/run/netns mount).

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

// Found is a pod's attachment as Find finds it: the namespace's path, and
// the container whose cgroup holds the pod's first process, its sandbox
// (the runtime starts the sandbox before any other container).
type Found struct {
	Netns       string
	ContainerID string
}

// Find finds the namespace of the pod with uid through its processes.
func Find(uid string) (Found, error) {
	if uid == "" || strings.ContainsAny(uid, "/\n") {
		return Found{}, fmt.Errorf("find a pod's namespace: bad uid %q", uid)
	}
	fs, err := procfs.NewFS(ProcDir)
	if err != nil {
		return Found{}, fmt.Errorf("find the namespace of pod %s: %w", uid, err)
	}
	procs, err := fs.AllProcs()
	if err != nil {
		return Found{}, fmt.Errorf("find the namespace of pod %s: %w", uid, err)
	}
	mounted := mountedNetns()
	var best Found
	var bestStart uint64
	for _, p := range procs {
		cgroups, err := p.Cgroups()
		if err != nil {
			continue // gone
		}
		container, ok := podCgroup(cgroups, uid)
		if !ok {
			continue
		}
		ino, dev, err := netns.Identify(filepath.Join(ProcDir, strconv.Itoa(p.PID), "ns", "net"))
		if err != nil {
			continue // gone, or not ours to read
		}
		path, ok := mounted[[2]uint64{ino, dev}]
		if !ok {
			continue
		}
		st, err := p.Stat()
		if err != nil {
			continue
		}
		if best.Netns == "" || st.Starttime < bestStart {
			best, bestStart = Found{Netns: path, ContainerID: container}, st.Starttime
		}
	}
	if best.Netns == "" {
		return Found{}, fmt.Errorf("pod %s: %w", uid, ErrNotFound)
	}
	return best, nil
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

// podCgroup tells whether a process in cgroups is in the cgroup of the
// pod with uid, with the name of the cgroup below it (the container's id;
// a systemd scope's "cri-containerd-" or "crio-" prefix and ".scope"
// suffix taken off). Any hierarchy will do.
func podCgroup(cgroups []procfs.Cgroup, uid string) (container string, ok bool) {
	names := []string{"pod" + uid, "pod" + strings.ReplaceAll(uid, "-", "_")}
	for _, cg := range cgroups {
		elems := strings.Split(cg.Path, "/")
		for i, el := range elems {
			el = strings.TrimSuffix(el, ".slice")
			for _, n := range names {
				if el != n && !strings.HasSuffix(el, "-"+n) {
					continue
				}
				if i+1 == len(elems) {
					return "", true
				}
				c := elems[i+1]
				if scope, ok := strings.CutSuffix(c, ".scope"); ok {
					c = scope[strings.LastIndex(scope, "-")+1:]
				}
				return c, true
			}
		}
	}
	return "", false
}
