//go:build kernel

package bench

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/test/harness"
)

// Placement and CPU time, for the fast-path and EBPF-mode benchmarks.
//
// On a machine with few CPUs, a round trip between processes that the
// scheduler puts on different CPUs pays a cross-CPU wake-up, which can cost
// more than the whole TCP/IP path and which no interception mode can
// remove. So every configuration runs in two placements, in alternating
// rounds:
//
//   - "one CPU": every process of the path (the benchmark's own process,
//     which is the app, the sidecars and the remote echo) pinned to the
//     same CPU, so that every wake-up stays local and a round trip is the
//     CPU work of the path;
//   - "spread": wherever the scheduler puts them.
//
// Pinning is inherited: the benchmark pins every thread of its own process
// (and runs with GOMAXPROCS 1, as a Go program started pinned does) before
// it starts a round's processes, and each process it starts takes the
// affinity of the thread that started it.
//
// Beside each latency, the CPU time per request: what every process of the
// path ran (the cgroup v2 the benchmark moves its own process into, which
// every process it starts inherits: cpu.stat usage_usec, user + system),
// plus the softirq work done outside them (ksoftirqd of the CPUs in use),
// plus, on kernels that account interrupt time apart
// (CONFIG_IRQ_TIME_ACCOUNTING), the softirq time of those CPUs from
// /proc/stat; elsewhere that time is already in the processes' system time.
// Over a fixed number of requests, this figure does not depend on where the
// wake-ups land.

// benchRounds is the number of alternating rounds: MESHWIRE_BENCH_ROUNDS,
// 10 by default (a smaller value makes a quick run).
func benchRounds(b *testing.B) int {
	n, err := parseRounds(os.Getenv(benchRoundsEnv))
	if err != nil {
		b.Fatalf("%s: %v", benchRoundsEnv, err)
	}
	return n
}

// placement is where the processes of a path run: on cpu alone, or with
// spread set wherever the scheduler puts them.
type placement struct {
	name   string
	cpu    int
	spread bool
}

// placements are "one CPU" (the last online CPU, as `taskset -c 1` on two)
// and "spread"; the targets are judged on the first.
func placements() []placement {
	return []placement{{name: "one CPU", cpu: runtime.NumCPU() - 1}, {name: "spread", spread: true}}
}

// cpus returns the CPUs p's processes run on.
func (p placement) cpus() []int {
	if !p.spread {
		return []int{p.cpu}
	}
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil || all.Count() == 0 {
		all.Zero()
		for i := 0; i < runtime.NumCPU(); i++ {
			all.Set(i)
		}
	}
	var out []int
	for i := 0; i < len(all)*64; i++ {
		if all.IsSet(i) {
			out = append(out, i)
		}
	}
	return out
}

// place pins every thread of the benchmark's process to p's CPUs (every
// process started until restore inherits it) and returns what restores
// the affinity the process had.
// inRounds runs run for each of n configurations in every placement, in
// benchRounds alternating rounds: the placements rotate and the
// configurations' order reverses from one round to the next. It returns
// the number of rounds.
func inRounds(b *testing.B, pls []placement, n int, run func(pl placement, i int)) int {
	rounds := benchRounds(b) * b.N
	for round := 0; round < rounds; round++ {
		for _, pl := range rotate(pls, round) {
			restore := place(b, pl)
			for k := 0; k < n; k++ {
				i := k
				if round%2 == 1 {
					i = n - 1 - k
				}
				run(pl, i)
			}
			restore()
		}
	}
	return rounds
}

func place(b *testing.B, p placement) (restore func()) {
	var before unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		b.Fatal(err)
	}
	if p.spread {
		return func() {}
	}
	var one unix.CPUSet
	one.Set(p.cpu)
	if err := setProcessAffinity(&one); err != nil {
		b.Fatalf("pin the benchmark to CPU %d: %v", p.cpu, err)
	}
	// As a Go program started by `taskset -c CPU` does (the processes
	// the benchmark starts do): one P, no thread spinning for work on
	// the CPU the others need.
	runtime.GOMAXPROCS(1)
	return func() {
		if err := setProcessAffinity(&before); err != nil {
			b.Errorf("restore the benchmark's CPU affinity: %v", err)
		}
		runtime.SetDefaultGOMAXPROCS()
	}
}

// setProcessAffinity sets the affinity of every thread of this process,
// again until a pass finds every thread set: a thread created during a
// pass takes its creator's affinity, perhaps the old one.
func setProcessAffinity(set *unix.CPUSet) error {
	for pass := 0; pass < 10; pass++ {
		tids, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		changed := false
		for _, t := range tids {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			var cur unix.CPUSet
			if err := unix.SchedGetaffinity(tid, &cur); err != nil {
				continue // the thread has exited
			}
			if cur == *set {
				continue
			}
			changed = true
			if err := unix.SchedSetaffinity(tid, set); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("thread %d: %w", tid, err)
			}
		}
		if !changed {
			return nil
		}
	}
	return errors.New("threads kept appearing with another affinity")
}

// checkPlaced fails unless each of pids runs only on p's CPU ("one CPU").
func checkPlaced(b *testing.B, p placement, what string, pids ...int) {
	if p.spread {
		return
	}
	for _, pid := range pids {
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(pid, &set); err != nil {
			b.Fatalf("%s: affinity of process %d: %v", what, pid, err)
		}
		if set.Count() != 1 || !set.IsSet(p.cpu) {
			b.Fatalf("%s: process %d may run on %d CPUs, want CPU %d alone", what, pid, set.Count(), p.cpu)
		}
	}
}

// cpuMeterName is the cgroup (under the cgroup2 mount) the benchmark runs
// in; one left by a run that was killed is removed when the next starts.
const cpuMeterName = "meshwire-bench"

// cpuMeter reads the CPU time of the benchmark's process and of every
// process it starts.
type cpuMeter struct {
	dir       string         // the cgroup
	ksoftirqd map[int]string // CPU -> its ksoftirqd's schedstat
	irqTime   bool           // the kernel accounts interrupt time apart
}

// newCPUMeter creates the benchmark's cgroup v2 and moves the benchmark's
// process into it; at cleanup, back to where it was, and the cgroup goes.
func newCPUMeter(b *testing.B) *cpuMeter {
	mnt, err := cgroup2Mount()
	if err != nil {
		b.Fatal(err)
	}
	home, err := ownCgroup()
	if err != nil {
		b.Fatal(err)
	}
	m := &cpuMeter{dir: filepath.Join(mnt, cpuMeterName), ksoftirqd: ksoftirqds(), irqTime: kernelConfig("CONFIG_IRQ_TIME_ACCOUNTING")}
	if err := removeCgroup(m.dir, mnt); err != nil {
		b.Fatalf("remove the cgroup an earlier run left: %v", err)
	}
	if err := os.Mkdir(m.dir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		_ = os.Remove(m.dir)
		b.Fatalf("move the benchmark into %s: %v", m.dir, err)
	}
	b.Cleanup(func() {
		if err := os.WriteFile(filepath.Join(mnt, home, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			b.Errorf("move the benchmark back to cgroup %s: %v", home, err)
			return
		}
		if err := removeCgroup(m.dir, mnt); err != nil {
			b.Errorf("remove %s: %v", m.dir, err)
		}
	})
	return m
}

// cgroup2Mount finds the cgroup v2 mount (/sys/fs/cgroup, or
// /sys/fs/cgroup/unified on a hybrid layout) in /proc/self/mountinfo.
func cgroup2Mount() (string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		if ok && len(f) >= 5 && strings.HasPrefix(post, "cgroup2 ") {
			return f[4], nil
		}
	}
	return "", errors.New("no cgroup2 file system is mounted (the CPU time per request needs one)")
}

// ownCgroup is this process's cgroup v2 path ("0::PATH" in /proc/self/cgroup).
func ownCgroup() (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("/proc/self/cgroup has no cgroup v2 entry")
}

// removeCgroup moves what dir holds to mnt's root cgroup and removes it;
// no dir is no error.
func removeCgroup(dir, mnt string) error {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, pid := range strings.Fields(string(data)) {
		_ = os.WriteFile(filepath.Join(mnt, "cgroup.procs"), []byte(pid), 0o644)
	}
	return os.Remove(dir)
}

// ksoftirqds maps each CPU to its ksoftirqd thread's schedstat file.
func ksoftirqds() map[int]string {
	out := map[int]string{}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		comm, err := os.ReadFile(filepath.Join("/proc", p.Name(), "comm"))
		if err != nil {
			continue
		}
		if n, ok := strings.CutPrefix(strings.TrimSpace(string(comm)), "ksoftirqd/"); ok {
			if cpu, err := strconv.Atoi(n); err == nil {
				out[cpu] = filepath.Join("/proc", p.Name(), "schedstat")
			}
		}
	}
	return out
}

// kernelConfig reports whether the running kernel was built with option
// (from /proc/config.gz, else /boot/config-RELEASE); unknown is false.
func kernelConfig(option string) bool {
	var r io.Reader
	if f, err := os.Open("/proc/config.gz"); err == nil {
		defer f.Close()
		if z, err := gzip.NewReader(f); err == nil {
			r = z
		}
	}
	if r == nil {
		var u unix.Utsname
		if unix.Uname(&u) != nil {
			return false
		}
		f, err := os.Open("/boot/config-" + unix.ByteSliceToString(u.Release[:]))
		if err != nil {
			return false
		}
		defer f.Close()
		r = f
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if sc.Text() == option+"=y" {
			return true
		}
	}
	return false
}

// cpuReading is the CPU time counters at one instant.
type cpuReading struct {
	procs     time.Duration // the cgroup's usage (user + system)
	ksoftirqd time.Duration // the ksoftirqd threads of the CPUs in use
	softirq   time.Duration // /proc/stat's softirq of the CPUs in use
}

// read takes the counters for cpus.
func (m *cpuMeter) read(b *testing.B, cpus []int) cpuReading {
	var r cpuReading
	stat, err := os.ReadFile(filepath.Join(m.dir, "cpu.stat"))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(stat), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, _ := strconv.ParseInt(v, 10, 64)
			r.procs = time.Duration(us) * time.Microsecond
		}
	}
	for _, cpu := range cpus {
		if data, err := os.ReadFile(m.ksoftirqd[cpu]); err == nil {
			ns, _ := strconv.ParseInt(strings.Fields(string(data))[0], 10, 64)
			r.ksoftirqd += time.Duration(ns)
		}
	}
	r.softirq = procStatSoftirq(cpus)
	return r
}

// procStatSoftirq sums the softirq column of /proc/stat over cpus.
func procStatSoftirq(cpus []int) time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	want := map[string]bool{}
	for _, c := range cpus {
		want["cpu"+strconv.Itoa(c)] = true
	}
	var ticks int64
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 7 && want[f[0]] {
			v, _ := strconv.ParseInt(f[7], 10, 64) // user nice system idle iowait irq softirq
			ticks += v
		}
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}

// perRequest measures fn, which makes n requests on cpus, and returns the
// CPU time per request.
func (m *cpuMeter) perRequest(b *testing.B, cpus []int, n int, fn func()) time.Duration {
	r0 := m.read(b, cpus)
	fn()
	r1 := m.read(b, cpus)
	d := r1.procs - r0.procs + r1.ksoftirqd - r0.ksoftirqd
	if m.irqTime {
		d += r1.softirq - r0.softirq
	}
	return d / time.Duration(n)
}

// pathRun is where one configuration's round runs, and its CPU meter;
// label names what it measures ("CONFIGURATION/PATH"), for profiling
// (perfctl_bench_test.go).
type pathRun struct {
	placement
	m     *cpuMeter
	label string
}

// on is r measuring path of configuration config.
func (r pathRun) on(config, path string) pathRun {
	r.label = config + "/" + path
	return r
}

// cpu measures fn, which makes n requests, and returns the CPU time per
// request.
func (r pathRun) cpu(b *testing.B, n int, fn func()) time.Duration {
	return r.m.perRequest(b, r.cpus(), n, fn)
}

// method says how the CPU time per request is counted, for table titles.
func (m *cpuMeter) method() string {
	s := "CPU µs per request: user + system of every process of the path (cgroup v2 cpu.stat) + ksoftirqd of the CPUs in use"
	if m.irqTime {
		return s + " + /proc/stat softirq of those CPUs"
	}
	return s + "; this kernel counts softirq work in the process it interrupts (no CONFIG_IRQ_TIME_ACCOUNTING), so it is in their system time"
}

// rounds are one figure's values, one per round.
type rounds = harness.Samples

// spreadCell is "median [min–max]" of per-round values, in µs.
func spreadCell(r rounds) string {
	if len(r) == 0 {
		return "-"
	}
	return fmt.Sprintf("%s [%s–%s]", fastpathBenchUs(r.Median()), fastpathBenchUs(r.Quantile(0)), fastpathBenchUs(r.Quantile(1)))
}

// placementNote says how the two placements are to be read, under every
// table of targets.
const placementNote = `Targets are judged on "one CPU" (every process of the path pinned to one CPU: each round trip is the path's CPU work) and on CPU time per request, each on its paired figure: in every round the configuration against the same round's baseline, the median of those per-round figures over the rounds (paired.go); "spread" (wherever the scheduler puts the processes) is reported, not judged: there each round trip between two processes on different CPUs also pays a cross-CPU wake-up, which no interception mode removes.`

// targets is a table of targets, one row per target and configuration:
// on "one CPU" the paired figure with its verdict, how many rounds met the
// target alone, the rounds in two groups and the figure from the rounds'
// medians; on "spread" the paired figure.
type targets struct {
	tab *harness.Table
	pls []placement
}

// figure is what a target is judged on in one placement.
type figure struct {
	paired  perRound // one figure per round, the configuration against the same round's baseline
	medians string   // the figure from the rounds' medians, with its parts
	groups  string   // the configuration's and the baseline's rounds in two groups
}

func newTargets(title string, pls []placement, nRounds int) *targets {
	return &targets{pls: pls, tab: &harness.Table{
		Title:  fmt.Sprintf("%s (%d rounds). %s", title, nRounds, placementNote),
		Header: []string{ColTarget, ColConfig, ColJudged, ColWithin, ColMet, ColGroups, ColMedians, ColSpread},
	}}
}

// judge adds a row: fig gives a placement's figure, judged on "one CPU"
// against l.
func (t *targets) judge(target, config string, l limit, fig func(placement string) figure) {
	one, spread := fig(t.pls[0].name), fig(t.pls[1].name)
	j := one.paired.judge(l)
	t.tab.Add(target, config, j.cell(l), j.rounds(), verdict(j.ok), one.groups, one.medians, spread.paired.judge(l).cell(l))
}

// once adds a row measured once rather than per placement (its pairs
// are the alternating samples).
func (t *targets) once(target, config string, l limit, f figure) {
	j := f.paired.judge(l)
	t.tab.Add(target, config, j.cell(l), j.rounds()+" pairs", verdict(j.ok), f.groups, f.medians, "(measured once)")
}

// beside adds a row that is printed, not judged: a figure that explains
// a judged one (l formats it).
func (t *targets) beside(target, config string, l limit, fig func(placement string) figure) {
	one, spread := fig(t.pls[0].name), fig(t.pls[1].name)
	t.tab.Add(target, config, one.paired.judge(l).cell(l), "", "not judged", one.groups, one.medians, spread.paired.judge(l).cell(l))
}

func (t *targets) write() { t.tab.Write(os.Stdout) }

// roundGroups is the configuration's and the baseline's rounds (x and
// base, in unit) in two groups each; higher says a higher value is the
// faster.
func roundGroups(x []float64, baseName string, base []float64, unit string, f func(float64) string, higher bool) string {
	return fmt.Sprintf("%s %s; %s: %s", groupsCell(x, f, higher), unit, baseName, groupsCell(base, f, higher))
}

// everyRound is a table of every round's figures, in round order, from
// which the paired figures of the targets come.
type everyRound struct{ tab *harness.Table }

func newEveryRound(title string, nRounds int) *everyRound {
	h := []string{"configuration", "figure"}
	for k := 1; k <= nRounds; k++ {
		h = append(h, fmt.Sprintf("round %d", k))
	}
	return &everyRound{tab: &harness.Table{Title: title + ": every round's figure, in round order (the paired figures of the targets come from these)", Header: h}}
}

func (e *everyRound) add(config, what string, v []float64, f func(float64) string) {
	row := []string{config, what}
	for _, x := range v {
		row = append(row, f(x))
	}
	for len(row) < len(e.tab.Header) {
		row = append(row, "")
	}
	e.tab.Add(row...)
}

func (e *everyRound) write() { e.tab.Write(os.Stdout) }
