package main

import (
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// The judged mode (`make bench-check`): every stated target of a run,
// met or missed, and an exit status that says so. The plugins' targets are
// judged as the targets block judges them (pluginTargets); the fast path's
// and EBPF mode's as their benchmarks printed them, on the paired
// per-round figures (test/bench/paired.go), from at least minRounds
// rounds; a benchmark that failed (a bound of its own, such as
// BenchmarkFullNode's, or its run) is a miss.

// judgedTables are the benchmarks that print a table of targets, and its
// title's start.
var judgedTables = []struct{ bench, prefix string }{
	{"BenchmarkFastpath", "fast path: targets"},
	{"BenchmarkCapture", "EBPF interception: targets"},
}

var targetRoundsRe = regexp.MustCompile(`\((\d+) rounds\)`)

// verdictRow is one target judged.
type verdictRow struct {
	bench, target, config, figure string
	met                           bool
}

// errNothingJudged is a run that holds no target to judge.
var errNothingJudged = fmt.Errorf("the output holds no stated target: run make bench (or make bench-fastpath)")

// judgeRun lists every stated target of r with its verdict. It fails on
// output that cannot be judged: no target at all, a table of targets
// from fewer than minRounds rounds, one the benchmark did not print.
func judgeRun(r *Run, minRounds int) ([]verdictRow, error) {
	var out []verdictRow
	for _, b := range r.Failed() {
		out = append(out, verdictRow{bench: b, target: "the benchmark's run and its own bounds", figure: "failed (see its log in the output)"})
	}
	ran := func(b string) bool { return r.Results[b] == "ok" }
	// The plugins' targets need every plugin benchmark's tables: judged
	// when all ran and passed (a failed one is a miss above; a run of
	// some is for looking).
	plugins := true
	for _, b := range pluginBenches {
		plugins = plugins && ran(b)
	}
	if plugins {
		rows, ps, err := pluginTargets(r)
		if err != nil {
			return nil, err
		}
		var peers []string
		for _, p := range ps {
			peers = append(peers, p.short)
		}
		for _, row := range rows {
			if row.met == nil {
				continue
			}
			out = append(out, verdictRow{bench: "plugins", target: row.what + " " + row.target, config: "against " + strings.Join(peers, ", "), figure: strings.Join(row.cells, "; "), met: *row.met})
		}
	}
	for _, jt := range judgedTables {
		if !ran(jt.bench) {
			continue
		}
		t, err := r.Find(jt.bench, jt.prefix)
		if err != nil {
			return nil, err
		}
		m := targetRoundsRe.FindStringSubmatch(t.Title)
		if m == nil {
			return nil, fmt.Errorf("table %q does not say from how many rounds: the output of an older benchmark? (run it again)", jt.prefix)
		}
		if n, _ := strconv.Atoi(m[1]); n < minRounds {
			return nil, fmt.Errorf("%s ran %d rounds: its targets are judged on at least %d (make bench, or make bench-fastpath ROUNDS=%d)", jt.bench, n, minRounds, minRounds)
		}
		printed, err := readTargets(t)
		if err != nil {
			return nil, err
		}
		for _, p := range printed {
			if p.met == "not judged" {
				continue
			}
			if p.met != "met" && p.met != "NOT MET" {
				return nil, fmt.Errorf("table %q: target %q (%s) has verdict %q", jt.prefix, p.target, p.config, p.met)
			}
			out = append(out, verdictRow{bench: jt.bench, target: p.target, config: p.config, figure: p.judged + ", " + p.within + " within", met: p.met == "met"})
		}
	}
	judged := 0
	for _, v := range out {
		if v.target != "the benchmark's run and its own bounds" {
			judged++
		}
	}
	if judged == 0 {
		return nil, errNothingJudged
	}
	return out, nil
}

// check writes the verdicts of the run in path and returns how many
// targets it missed.
func check(path string, minRounds int, stdout io.Writer) (int, error) {
	r, err := readRun(path, false)
	if err != nil {
		return 0, err
	}
	rows, err := judgeRun(r, minRounds)
	if err != nil {
		return 0, fmt.Errorf("%s: %v", path, err)
	}
	t := &Table{Header: []string{"benchmark", "target", "configuration", "figure", "met"}}
	missed := 0
	for _, v := range rows {
		met := "yes"
		if !v.met {
			met, missed = "**no**", missed+1
		}
		t.Rows = append(t.Rows, []string{v.bench, v.target, v.config, v.figure, met})
	}
	tree := ""
	if r.Tree != "clean" {
		tree = " (a " + orUnknown(r.Tree) + " tree: not a run to publish)"
	}
	fmt.Fprintf(stdout, "### bench-check: `make %s` at %s, %s%s\n\n%s\n", r.Target, short(r.Commit), r.Started.UTC().Format("2006-01-02 15:04 MST"), tree, t.Markdown())
	if missed > 0 {
		fmt.Fprintf(stdout, "bench-check: %d of %d targets missed\n", missed, len(rows))
	} else {
		fmt.Fprintf(stdout, "bench-check: all %d targets met\n", len(rows))
	}
	return missed, nil
}
