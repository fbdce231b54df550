package framework

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// userHZ is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const userHZ = 100

// agents are the node agents' processes, by what their command line
// starts with (argv[0]'s base name and the first argument): CPU time
// they spend is the network's own cost beside the plugins'.
var agents = map[string]string{"meshwire node": "meshwire agent", "install-cni": "istio-cni agent"}

// SampleCPU is where the machine's CPU time went so far, in seconds: the
// whole machine's busy time ("machine", from /proc/stat), and each of the
// cluster's processes (cluster.sh's pid files under the state directory,
// summed over the nodes by component; containerd's figure includes the
// CNI plugins it ran and waited for) and the node agents (found by their
// command line).
func SampleCPU() map[string]float64 {
	s := map[string]float64{"machine": machineBusy()}
	pids, _ := filepath.Glob(filepath.Join(StateDir(), "run", "*.pid"))
	for _, f := range pids {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		name := strings.TrimSuffix(filepath.Base(f), ".pid")
		if i := strings.LastIndexByte(name, '.'); i >= 0 {
			name = name[i+1:] // mwk-node1.kubelet: the component
		}
		if name == "holder" || name == "kernel-test-lock" {
			continue // cluster.sh's own: a node's namespaces, the tests' lock
		}
		if name == "containerd" {
			name = "containerd (and the plugins it ran)"
		}
		s[name] += procCPU(strings.TrimSpace(string(b)), true)
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := bytes.Split(bytes.TrimRight(cmd, "\x00"), []byte{0})
		key := filepath.Base(string(args[0]))
		if len(args) > 1 {
			if _, ok := agents[key+" "+string(args[1])]; ok {
				key += " " + string(args[1])
			}
		}
		if name, ok := agents[key]; ok {
			s[name] += procCPU(e.Name(), false)
		}
	}
	return s
}

// CPUDelta is after minus before, per key of after.
func CPUDelta(before, after map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for k, v := range after {
		d[k] = v - before[k]
	}
	return d
}

// CPULine is a sample as one line, the machine first, then the largest.
func CPULine(s map[string]float64) string {
	var keys []string
	for k := range s {
		if k != "machine" {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return s[keys[i]] > s[keys[j]] })
	parts := []string{strconv.FormatFloat(s["machine"], 'f', 1, 64) + " s on the machine"}
	for _, k := range keys {
		parts = append(parts, k+" "+strconv.FormatFloat(s[k], 'f', 1, 64))
	}
	return strings.Join(parts, ", ")
}

// procCPU is pid's user and system time in seconds, with its waited-for
// children's when children.
func procCPU(pid string, children bool) float64 {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return 0
	}
	// The fields after the command's closing parenthesis: state is the
	// first, utime the 12th, stime, cutime, cstime the next three.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return 0
	}
	n := 2
	if children {
		n = 4
	}
	var ticks float64
	for _, x := range f[11 : 11+n] {
		v, _ := strconv.ParseFloat(x, 64)
		ticks += v
	}
	return ticks / userHZ
}

// machineBusy is the machine's CPU time in seconds, idle and iowait left
// out (/proc/stat's cpu line).
func machineBusy() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var ticks float64
	for i, x := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		if i >= 8 { // guest times are in user's already
			break
		}
		v, _ := strconv.ParseFloat(x, 64)
		ticks += v
	}
	return ticks / userHZ
}

// CompareCPU is a table of a's and b's CPU time per pod-start round, the
// median over their rounds, by component: where a round's time goes on
// each network (not judged).
func CompareCPU(aName string, a PodStartResult, bName string, b PodStartResult) string {
	keys := map[string]bool{}
	for _, r := range append(slices.Clone(a.CPU), b.CPU...) {
		for k := range r {
			keys[k] = true
		}
	}
	median := func(rs []map[string]float64, k string) float64 {
		var xs []float64
		for _, r := range rs {
			xs = append(xs, r[k])
		}
		return Percentile(xs, 50)
	}
	var names []string
	for k := range keys {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool {
		if (names[i] == "machine") != (names[j] == "machine") {
			return names[i] == "machine"
		}
		return median(a.CPU, names[i])+median(b.CPU, names[i]) > median(a.CPU, names[j])+median(b.CPU, names[j])
	})
	table := fmt.Sprintf("| CPU s per round, creates to the last Ready (median of %d and %d rounds) | %s | %s |\n|---|---|---|\n", len(a.CPU), len(b.CPU), aName, bName)
	for _, k := range names {
		table += fmt.Sprintf("| %s | %.1f | %.1f |\n", k, median(a.CPU, k), median(b.CPU, k))
	}
	return table
}

// containerID is a runtime's container id: the name runc gives a
// container's cgroup under its parent.
var containerID = regexp.MustCompile(`^[0-9a-f]{64}$`)

// PodsCPU is the CPU time, in seconds, that each container of node n's
// pods (their pause containers included) has spent so far: the cgroup v1
// cpuacct.usage of every container cgroup (a directory named by a
// 64-hex-digit container id) under the node's cpuacct cgroup, the
// hierarchy's root for the host's node, the node's own cgroup for a node
// in namespaces of its own. Work done in softirq is charged to whatever
// task it interrupted (this kernel does no IRQ time accounting); work in
// ksoftirqd is not a pod's. A container that exits between two samples
// drops out of PodsCPUDelta.
func PodsCPU(n Node) (map[string]float64, error) {
	root := "/sys/fs/cgroup/cpuacct"
	if n.Dir != "" {
		b, err := os.ReadFile(filepath.Join(n.Dir, "cgroups"))
		if err != nil {
			return nil, err
		}
		root = ""
		for _, l := range strings.Fields(string(b)) {
			if strings.HasPrefix(l, "/sys/fs/cgroup/cpuacct/") || strings.HasPrefix(l, "/sys/fs/cgroup/cpu,cpuacct/") {
				root = l
			}
		}
		if root == "" {
			return nil, fmt.Errorf("node %s: no cpuacct cgroup in %s/cgroups", n.Name, n.Dir)
		}
	}
	usage, err := containersCPU(root)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	return usage, nil
}

// containersCPU reads cpuacct.usage of every container cgroup under
// root, up to 3 levels of other cgroups down (kubelet's pod and QoS
// cgroups, a runtime's namespace), by path, in seconds.
func containersCPU(root string) (map[string]float64, error) {
	usage := map[string]float64{}
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			p := filepath.Join(dir, e.Name())
			if !containerID.MatchString(e.Name()) {
				if depth < 3 {
					_ = walk(p, depth+1) // a cgroup gone meanwhile
				}
				continue
			}
			b, err := os.ReadFile(filepath.Join(p, "cpuacct.usage"))
			if err != nil {
				continue // gone meanwhile
			}
			ns, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
			if err == nil {
				usage[p] = ns / 1e9
			}
		}
		return nil
	}
	if err := walk(root, 0); err != nil {
		return nil, err
	}
	if len(usage) == 0 {
		return nil, fmt.Errorf("no container cgroup under %s", root)
	}
	return usage, nil
}

// PodsCPUDelta is the CPU seconds the containers of both samples spent
// between them, summed.
func PodsCPUDelta(before, after map[string]float64) float64 {
	var s float64
	for k, v := range after {
		if b, ok := before[k]; ok {
			s += v - b
		}
	}
	return s
}
