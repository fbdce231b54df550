package harness

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Samples collects latencies of one operation.
type Samples []time.Duration

// Time runs fn and records how long it took.
func (s *Samples) Time(fn func() error) error {
	start := time.Now()
	err := fn()
	*s = append(*s, time.Since(start))
	return err
}

// Quantile returns the q-quantile (0..1) by nearest rank.
func (s Samples) Quantile(q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := append(Samples(nil), s...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	i := int(q*float64(len(c))+0.5) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(c) {
		i = len(c) - 1
	}
	return c[i]
}

// Median is the 0.5 quantile.
func (s Samples) Median() time.Duration { return s.Quantile(0.5) }

// P95 is the 0.95 quantile.
func (s Samples) P95() time.Duration { return s.Quantile(0.95) }

// Ms formats a duration in milliseconds with two decimals.
func Ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }

// Ratio formats a/b as "0.42x".
func Ratio(a, b time.Duration) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", float64(a)/float64(b))
}

// Table is a markdown table printed by benchmarks, ready to paste into
// docs/performance.md.
type Table struct {
	Title  string
	Header []string
	Rows   [][]string
}

// Add appends a row.
func (t *Table) Add(cells ...string) { t.Rows = append(t.Rows, cells) }

// Write prints the table as markdown.
func (t *Table) Write(w io.Writer) {
	fmt.Fprintf(w, "\n### %s\n\n| %s |\n|%s\n", t.Title, strings.Join(t.Header, " | "), strings.Repeat("---|", len(t.Header)))
	for _, r := range t.Rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
	fmt.Fprintln(w)
}

// ReferenceDir is where Debian's containernetworking-plugins installs the
// reference plugins that benchmarks compare against.
const ReferenceDir = "/usr/lib/cni"

// WaitIdle returns once the machine's CPUs were at least 90% idle over a
// 200 ms window (the kernel finished tearing down what an earlier run
// removed: namespaces, devices, conntrack entries), or after limit; it
// reports whether the machine settled. Benchmarks call it before each
// timed run so that one implementation's run does not pay for another's
// aftermath.
func WaitIdle(limit time.Duration) bool {
	read := func() (idle, total uint64) {
		b, err := os.ReadFile("/proc/stat")
		if err != nil {
			return 0, 0
		}
		line, _, _ := strings.Cut(string(b), "\n")
		for i, f := range strings.Fields(line)[1:] {
			v, _ := strconv.ParseUint(f, 10, 64)
			total += v
			if i == 3 || i == 4 { // idle, iowait
				idle += v
			}
		}
		return idle, total
	}
	for end := time.Now().Add(limit); time.Now().Before(end); {
		i0, t0 := read()
		time.Sleep(200 * time.Millisecond)
		i1, t1 := read()
		if t1 > t0 && float64(i1-i0) >= 0.9*float64(t1-t0) {
			return true
		}
	}
	return false
}
