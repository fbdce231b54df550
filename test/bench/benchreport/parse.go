package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"
)

// headerPrefix starts the lines `make bench` writes around the benchmarks'
// own output: "meshwire-bench: KEY VALUE".
const headerPrefix = "meshwire-bench: "

// Run is one `make bench` output: its header and footer, the markdown
// tables the benchmarks printed, their other lines, and which benchmarks
// passed.
type Run struct {
	Target    string // the make target that ran it: "bench" or "bench-fastpath"
	Commit    string // full hash
	Tree      string // "clean" or "dirty"
	Started   time.Time
	Finished  time.Time
	Machine   string
	LoadA     string // load averages at start
	LoadB     string // and at end
	Exit      string // go test's exit status
	Tables    []*Table
	Lines     []string            // every line that is not a table's
	Results   map[string]string   // benchmark name (without -N) -> "ok" or "FAIL"
	Unsettled map[string]int      // benchmark name -> timed blocks it began on a machine that did not settle
	header    map[string][]string // every meshwire-bench: key, for errors
}

// Table is one markdown table as harness.Table.Write prints it.
type Table struct {
	Title  string
	Header []string
	Rows   [][]string
}

var (
	benchLine = regexp.MustCompile(`^(Benchmark\w+)(-\d+)?\s+\d+\s`)
	failLine  = regexp.MustCompile(`^\s*--- FAIL: (Benchmark\w+)`)
	logHead   = regexp.MustCompile(`^\s*--- (?:BENCH|FAIL|SKIP): (Benchmark\w+)`)
)

// Parse reads a `make bench` output.
func Parse(r io.Reader) (*Run, error) {
	run := &Run{Results: map[string]string{}, Unsettled: map[string]int{}, header: map[string][]string{}}
	logOf := "" // the benchmark whose log lines follow
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var lines []string
	for sc.Scan() {
		lines = append(lines, strings.TrimRight(sc.Text(), "\r"))
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if kv, ok := strings.CutPrefix(l, headerPrefix); ok {
			k, v := splitHeader(kv)
			run.header[k] = append(run.header[k], v)
			continue
		}
		if title, ok := strings.CutPrefix(l, "### "); ok && i+2 < len(lines) && lines[i+1] == "" && strings.HasPrefix(lines[i+2], "|") {
			t := &Table{Title: title, Header: cells(lines[i+2])}
			j := i + 3
			if j < len(lines) && strings.HasPrefix(lines[j], "|---") {
				j++
			}
			for ; j < len(lines) && strings.HasPrefix(lines[j], "|"); j++ {
				t.Rows = append(t.Rows, cells(lines[j]))
			}
			run.Tables = append(run.Tables, t)
			i = j - 1
			continue
		}
		if m := benchLine.FindStringSubmatch(l); m != nil {
			if run.Results[m[1]] == "" {
				run.Results[m[1]] = "ok"
			}
		}
		if m := failLine.FindStringSubmatch(l); m != nil {
			run.Results[m[1]] = "FAIL"
		}
		if m := logHead.FindStringSubmatch(l); m != nil {
			logOf = m[1]
		} else if !strings.HasPrefix(l, " ") && !strings.HasPrefix(l, "\t") {
			logOf = ""
		}
		if logOf != "" && strings.Contains(l, "the machine did not settle before") {
			run.Unsettled[logOf]++
		}
		run.Lines = append(run.Lines, l)
	}
	one := func(k string) string {
		if v := run.header[k]; len(v) > 0 {
			return v[len(v)-1]
		}
		return ""
	}
	run.Commit, run.Tree, run.Machine, run.Exit = one("commit"), one("tree"), one("machine"), one("exit")
	run.Target = one("target")
	if run.Target == "" {
		run.Target = "bench" // written before the header named its target
	}
	run.LoadA, run.LoadB = one("load at start"), one("load at end")
	var err error
	if s := one("started"); s != "" {
		if run.Started, err = time.Parse(time.RFC3339, s); err != nil {
			return nil, fmt.Errorf("started: %v", err)
		}
	}
	if s := one("finished"); s != "" {
		if run.Finished, err = time.Parse(time.RFC3339, s); err != nil {
			return nil, fmt.Errorf("finished: %v", err)
		}
	}
	return run, nil
}

// headerKeys are the keys of the header lines, longest first where one
// starts another.
var headerKeys = []string{"load at start", "load at end", "commit", "tree", "started", "finished", "machine", "bench", "target", "rounds", "exit"}

func splitHeader(kv string) (key, value string) {
	for _, k := range headerKeys {
		if v, ok := strings.CutPrefix(kv, k+" "); ok {
			return k, v
		}
		if kv == k {
			return k, ""
		}
	}
	k, v, _ := strings.Cut(kv, " ")
	return k, v
}

func cells(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(line, "|")
	line = strings.TrimSuffix(line, "|")
	parts := strings.Split(line, "|")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return parts
}

// Check refuses a run that cannot be published: not from a clean tree at
// a known commit, not finished, or failed other than by benchmarks that
// report their failure (a build error, a panic, a time-out). A failed
// benchmark's tables are refused by Find; the run block names it.
func (r *Run) Check() error {
	if r.Commit != "" && r.Tree != "clean" {
		return fmt.Errorf("the run was made from a %s tree at %s: commit, then run make bench again", orUnknown(r.Tree), short(r.Commit))
	}
	return r.CheckFinished()
}

// CheckFinished is Check but for the tree: a run to judge, not to
// publish.
func (r *Run) CheckFinished() error {
	switch {
	case r.Commit == "":
		return fmt.Errorf("no %q line: not the output of `make bench`", headerPrefix+"commit")
	case r.Started.IsZero():
		return fmt.Errorf("no start date in the output")
	case r.Finished.IsZero() || r.Exit == "":
		return fmt.Errorf("the run did not finish (no exit status): an interrupted make bench")
	case r.Exit != "0" && len(r.Failed()) == 0:
		return fmt.Errorf("go test exited with status %s and no benchmark reported a failure (a build error, a panic or a time-out?): fix and run make bench again", r.Exit)
	}
	return nil
}

// Failed are the benchmarks that failed, sorted.
func (r *Run) Failed() []string {
	var failed []string
	for name, res := range r.Results {
		if res == "FAIL" {
			failed = append(failed, name)
		}
	}
	slices.Sort(failed)
	return failed
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func short(commit string) string {
	if len(commit) > 7 {
		return commit[:7]
	}
	return commit
}

// Find returns the table whose title starts with prefix; bench names the
// benchmark that prints it, for the error.
func (r *Run) Find(bench, prefix string) (*Table, error) {
	if r.Results[bench] == "FAIL" {
		return nil, fmt.Errorf("%s failed in this run: its tables are not published (make bench BENCH=%s)", bench, bench)
	}
	for _, t := range r.Tables {
		if strings.HasPrefix(t.Title, prefix) {
			return t, nil
		}
	}
	why := "it did not run"
	if res := r.Results[bench]; res != "" {
		why = "it " + map[string]string{"ok": "ran but printed no such table", "FAIL": "failed"}[res]
	}
	return nil, fmt.Errorf("no table %q in the output: %s needs it (%s; make bench BENCH=%s)", prefix, bench, why, bench)
}

// Line returns the text after prefix of the first output line that starts
// with it.
func (r *Run) Line(bench, prefix string) (string, error) {
	for _, l := range r.Lines {
		if v, ok := strings.CutPrefix(l, prefix); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("no line %q in the output: %s prints it (make bench BENCH=%s)", prefix, bench, bench)
}

// Col is the index of the column named name.
func (t *Table) Col(name string) (int, error) {
	for i, h := range t.Header {
		if h == name {
			return i, nil
		}
	}
	return 0, fmt.Errorf("table %q has no column %q", t.Title, name)
}

// Row returns the row whose first cells are keys.
func (t *Table) Row(keys ...string) ([]string, error) {
rows:
	for _, r := range t.Rows {
		if len(r) < len(keys) {
			continue
		}
		for i, k := range keys {
			if r[i] != k {
				continue rows
			}
		}
		return r, nil
	}
	return nil, fmt.Errorf("table %q has no row %q", t.Title, strings.Join(keys, " | "))
}

// Cell is the cell of column col in the row whose first cells are keys.
func (t *Table) Cell(col string, keys ...string) (string, error) {
	c, err := t.Col(col)
	if err != nil {
		return "", err
	}
	r, err := t.Row(keys...)
	if err != nil {
		return "", err
	}
	if c >= len(r) {
		return "", fmt.Errorf("table %q, row %q: no cell in column %q", t.Title, strings.Join(keys, " | "), col)
	}
	return r[c], nil
}

// Markdown prints the table as harness.Table.Write does, without the
// title.
func (t *Table) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| %s |\n|%s\n", strings.Join(t.Header, " | "), strings.Repeat("---|", len(t.Header)))
	for _, r := range t.Rows {
		fmt.Fprintf(&b, "| %s |\n", strings.Join(r, " | "))
	}
	return b.String()
}
