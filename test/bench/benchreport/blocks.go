package main

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	mwbench "github.com/meshwire/meshwire/test/bench"
)

// A block is what the tool writes between <!-- bench:NAME --> and
// <!-- /bench:NAME --> in a document.
type block func(r *Run) (string, error)

// blocks are every block a document may hold, by name.
var blocks = map[string]block{
	"run":               runBlock,
	"targets":           targetsBlock,
	"capture":           captureBlock,
	"fastpath":          fastpathBlock,
	"fastpath-headline": fastpathHeadline,

	"hostlocal-add":        verbatim("BenchmarkHostLocal", "host-local: median latency (ms) of one ADD,"),
	"hostlocal-del":        verbatim("BenchmarkHostLocal", "host-local: median latency (ms) of one DEL,"),
	"hostlocal-upgrade":    verbatim("BenchmarkHostLocal", "host-local: meshwire on a node upgraded from the reference"),
	"bridge":               verbatim("BenchmarkBridge", "bridge + host-local: "),
	"portmap":              verbatim("BenchmarkPortmap", "bridge + host-local + portmap through libcni"),
	"portmap-mapped":       verbatim("BenchmarkPortmap", "ADD median with 1,000 pods mapped / with 0 mapped"),
	"portmap-nftables":     verbatim("BenchmarkPortmap", "meshwire with backend nftables"),
	"bandwidth-throughput": verbatim("BenchmarkBandwidth", "bandwidth: achieved throughput"),
	"bandwidth-ping":       verbatim("BenchmarkBandwidth", "bandwidth: ping round trip"),
	"iptables-init":        verbatim("BenchmarkIntercept", "iptables-init: time to apply"),
	"intercept-rtt":        verbatim("BenchmarkIntercept", "interception: request round trip"),
	"intercept-throughput": verbatim("BenchmarkIntercept", "interception: throughput"),
}

// stamp is the line above every table: which run it comes from, when,
// on what, and how many of the timed blocks of benches began before the
// machine settled.
func stamp(r *Run, placement string, benches ...string) string {
	unsettled := 0
	for _, b := range benches {
		unsettled += r.Unsettled[b]
	}
	settled := "every timed block began on a settled machine"
	if unsettled > 0 {
		settled = fmt.Sprintf("%d timed blocks began before the machine settled", unsettled)
	}
	return fmt.Sprintf("*`make %s` at %s, %s; %s; %s; load %s at start, %s at end; %s.*",
		r.Target, short(r.Commit), r.Started.UTC().Format("2006-01-02"), r.Machine, placement, firstField(r.LoadA), firstField(r.LoadB), settled)
}

const unpinned = "processes where the scheduler puts them"

func firstField(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return f[0]
	}
	return "?"
}

// runBlock is the paragraph naming the run.
func runBlock(r *Run) (string, error) {
	d := r.Finished.Sub(r.Started).Round(time.Minute)
	text := fmt.Sprintf("One full `make bench` run at commit %s (a clean tree), on %s from %s to %s UTC (%d minutes), on %s; load average %s at start, %s at end.",
		short(r.Commit), r.Started.UTC().Format("2006-01-02"), r.Started.UTC().Format("15:04"), r.Finished.UTC().Format("15:04"),
		int(d.Minutes()), r.Machine, firstField(r.LoadA), firstField(r.LoadB))
	if failed := r.Failed(); len(failed) > 0 {
		text += fmt.Sprintf(" Failed in this run: %s; no table here comes from it.", strings.Join(failed, ", "))
	}
	return text, nil
}

// verbatim is a table as the benchmark printed it, under its title.
func verbatim(bench, prefix string) block {
	return func(r *Run) (string, error) {
		t, err := r.Find(bench, prefix)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("### %s\n\n%s\n\n%s", t.Title, stamp(r, unpinned, bench), t.Markdown()), nil
	}
}

// num is the number a cell starts with ("0.27x", "9.6", "8.5 [7.9–9.0]").
func num(cell string) (float64, error) {
	s := strings.TrimSpace(cell)
	end := 0
	for end < len(s) && (s[end] == '-' || s[end] == '.' || (s[end] >= '0' && s[end] <= '9')) {
		end++
	}
	v, err := strconv.ParseFloat(s[:end], 64)
	if err != nil {
		return 0, fmt.Errorf("cell %q: not a number", cell)
	}
	return v, nil
}

// peer is one implementation meshwire is compared with.
type peer struct{ long, short string }

// peersOf reads the peers from the bridge table's "NAME median" columns.
func peersOf(t *Table) []peer {
	var ps []peer
	for _, h := range t.Header {
		if n, ok := strings.CutSuffix(h, " median"); ok && n != "meshwire" {
			ps = append(ps, peer{long: n, short: strings.TrimPrefix(n, "reference ")})
		}
	}
	return ps
}

// span is "a" or "a–b", the range of vs formatted with f.
func span(vs []float64, f string) string {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range vs {
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	a, b := fmt.Sprintf(f, lo), fmt.Sprintf(f, hi)
	if a == b {
		return a
	}
	return a + "–" + b
}

// targetRow is one row of the targets table: its cell per peer, and
// whether the target holds (nil: not judged).
type targetRow struct {
	what, target string
	cells        []string
	met          *bool
}

func judged(ok bool) *bool { return &ok }

// targetsBlock is the table of stated targets, against each peer, from the
// plugin benchmarks' tables.
func targetsBlock(r *Run) (string, error) {
	rows, ps, err := pluginTargets(r)
	if err != nil {
		return "", err
	}
	t := &Table{Header: []string{"what", "target"}}
	for _, p := range ps {
		t.Header = append(t.Header, "against "+p.long)
	}
	t.Header = append(t.Header, "met")
	var missed []string
	for _, row := range rows {
		met := "(not judged)"
		if row.met != nil {
			met = "yes"
			if !*row.met {
				met, missed = "**no**", append(missed, row.what)
			}
		}
		t.Rows = append(t.Rows, append(append([]string{row.what, row.target}, row.cells...), met))
	}
	verdict := "Every judged target holds against every peer in this run."
	if len(missed) > 0 {
		verdict = "Not met in this run: " + strings.Join(missed, "; ") + "."
	}
	return fmt.Sprintf("%s\n\n%s\n%s", stamp(r, unpinned, pluginBenches...), t.Markdown(), verdict), nil
}

// pluginBenches are the benchmarks the plugins' targets come from.
var pluginBenches = []string{"BenchmarkHostLocal", "BenchmarkBridge", "BenchmarkPortmap", "BenchmarkBandwidth", "BenchmarkIntercept"}

// pluginTargets judges the plugins' stated targets from their benchmarks'
// tables, against each peer: one row per target.
func pluginTargets(r *Run) ([]targetRow, []peer, error) {
	var e errs
	hlAdd := e.table(r, "BenchmarkHostLocal", "host-local: median latency (ms) of one ADD,")
	br := e.table(r, "BenchmarkBridge", "bridge + host-local: ")
	pm := e.table(r, "BenchmarkPortmap", "bridge + host-local + portmap through libcni")
	pmm := e.table(r, "BenchmarkPortmap", "ADD median with 1,000 pods mapped / with 0 mapped")
	thr := e.table(r, "BenchmarkBandwidth", "bandwidth: achieved throughput")
	ping := e.table(r, "BenchmarkBandwidth", "bandwidth: ping round trip")
	ipt := e.table(r, "BenchmarkIntercept", "iptables-init: time to apply")
	own, err := r.Line("BenchmarkHostLocal", "meshwire ADD at 50,000 / at 0:")
	e.add(err)
	if e.err != nil {
		return nil, nil, e.err
	}
	ps := peersOf(br)
	if len(ps) == 0 {
		return nil, nil, fmt.Errorf("table %q names no peer", br.Title)
	}
	var rows []targetRow

	// host-local
	ownV := e.num(own)
	row := targetRow{what: "host-local ADD at 50,000 allocated / at 0 (meshwire's own)", target: "<= 1.5x", met: judged(ownV <= 1.5)}
	for range ps {
		row.cells = append(row.cells, fmt.Sprintf("%.2fx", ownV))
	}
	rows = append(rows, row)
	row = targetRow{what: "host-local ADD at 50,000, peer / meshwire", target: ">= 20x", met: judged(true)}
	for _, p := range ps {
		v := e.num(e.cell(hlAdd, p.short+" / meshwire", "50000"))
		row.cells = append(row.cells, fmt.Sprintf("%.0fx", v))
		*row.met = *row.met && v >= 20
	}
	rows = append(rows, row)

	// bridge, portmap: meshwire / peer medians at most max.
	ratios := func(what, target string, max float64, t *Table, keys ...[]string) {
		row := targetRow{what: what, target: target, met: judged(true)}
		for _, p := range ps {
			var fs []string
			for _, k := range keys {
				c := e.cell(t, "vs "+p.short, k...)
				fs = append(fs, c)
				*row.met = *row.met && e.num(c) <= max
			}
			row.cells = append(row.cells, strings.Join(fs, " / "))
		}
		rows = append(rows, row)
	}
	ratios("bridge + host-local ADD median, one at a time / 20 at a time", "<= 0.6x", 0.6, br, []string{"ADD", "1"}, []string{"ADD", "20"})
	ratios("bridge + host-local DEL median, one at a time / 20 at a time", "<= 0.3x", 0.3, br, []string{"DEL", "1"}, []string{"DEL", "20"})
	ratios("portmap ADD median, 1 / 10 host ports, 0 pods mapped", "<= 0.5x", 0.5, pm, []string{"ADD", "1", "0"}, []string{"ADD", "10", "0"})

	mw1, mw10 := e.cell(pmm, "meshwire", "1"), e.cell(pmm, "meshwire", "10")
	row = targetRow{what: "portmap ADD with 1,000 pods mapped / with 0, 1 / 10 host ports (meshwire's own; the peer's in brackets)", target: "<= 2x",
		met: judged(e.num(mw1) <= 2 && e.num(mw10) <= 2)}
	for _, p := range ps {
		row.cells = append(row.cells, fmt.Sprintf("%s / %s (%s: %s / %s)", mw1, mw10, p.short, e.cell(pmm, p.long, "1"), e.cell(pmm, p.long, "10")))
	}
	rows = append(rows, row)

	// bandwidth
	column := func(t *Table, col string, keep func([]string) bool) []float64 {
		c, err := t.Col(col)
		e.add(err)
		var vs []float64
		for _, r := range t.Rows {
			if c < len(r) && (keep == nil || keep(r)) {
				vs = append(vs, e.num(r[c]))
			}
		}
		if len(vs) == 0 && err == nil {
			e.add(fmt.Errorf("table %q: no rows", t.Title))
		}
		return vs
	}
	mwThr := column(thr, "meshwire ratio", nil)
	row = targetRow{what: "bandwidth achieved / configured, 10 Mbit/s – 1 Gbit/s, both directions", target: "±10%", met: judged(true)}
	for _, v := range mwThr {
		*row.met = *row.met && math.Abs(v-1) <= 0.1
	}
	for _, p := range ps {
		row.cells = append(row.cells, fmt.Sprintf("%s (%s: %s)", span(mwThr, "%.2f"), p.short, span(column(thr, p.long+" ratio", nil), "%.2f")))
	}
	rows = append(rows, row)
	idle := func(r []string) bool { return len(r) > 1 && r[1] == "idle" }
	mwIdle := column(ping, "meshwire", idle)
	row = targetRow{what: "bandwidth idle ping through a shaped link", target: fmt.Sprintf("near unshaped (%s ms)", span(column(ping, "unshaped", idle), "%.2f"))}
	for _, p := range ps {
		row.cells = append(row.cells, fmt.Sprintf("%s ms (%s: %s ms)", span(mwIdle, "%.2f"), p.short, span(column(ping, p.long, idle), "%.2f")))
	}
	rows = append(rows, row)

	// iptables-init
	var fresh []string
	for _, b := range []struct{ row, name string }{{"iptables-nft", "iptables-nft"}, {"iptables-legacy", "legacy"}, {"nftables (native)", "nftables"}} {
		fresh = append(fresh, fmt.Sprintf("%.0f ms %s", e.num(e.cell(ipt, "fresh install", b.row)), b.name))
	}
	perRule := column(ipt, "fresh / per-rule", func(r []string) bool { return !strings.Contains(strings.Join(r, "|"), "n/a") })
	row = targetRow{what: "iptables-init default rule set, fresh install", target: "(no reference)",
		cells: []string{strings.Join(fresh, ", ") + "; " + span(perRule, "%.2fx") + " of one exec per rule"}}
	for range ps[1:] {
		row.cells = append(row.cells, "")
	}
	rows = append(rows, row)
	if e.err != nil {
		return nil, nil, e.err
	}
	return rows, ps, nil
}

var (
	roundsRe    = regexp.MustCompile(`\((\d+) rounds;`)
	thresholdRe = regexp.MustCompile(`[<>]=\s*[0-9.]+[x%]?`)
)

// captureBlock is EBPF interception mode against REDIRECT per proxied
// connection, on one CPU, with the verdicts of BenchmarkCapture's
// targets.
func captureBlock(r *Run) (string, error) {
	const bench = "BenchmarkCapture"
	var e errs
	per := e.table(r, bench, "EBPF interception, one CPU: per proxied connection")
	add := e.table(r, bench, "EBPF interception: chained intercept ADD")
	tg := e.table(r, bench, "EBPF interception: targets")
	if e.err != nil {
		return "", e.err
	}
	configs := []string{"REDIRECT", "EBPF", "EBPF + fast path"}
	// after is the cell of the first column named col after the column
	// named from (the table has a "vs REDIRECT" after each figure).
	after := func(from, col, config string) string {
		i, err := per.Col(from)
		if err != nil {
			e.add(err)
			return ""
		}
		row, err := per.Row(config)
		if err != nil {
			e.add(err)
			return ""
		}
		for j := i + 1; j < len(per.Header); j++ {
			if per.Header[j] == col && j < len(row) {
				return row[j]
			}
		}
		e.add(fmt.Errorf("table %q has no column %q after %q", per.Title, col, from))
		return ""
	}
	printed, err := readTargets(tg)
	e.add(err)
	// verdict finds the targets row of target (a prefix) and config: the
	// target, its judged figure and whether it was met.
	verdict := func(target, config, fallback string) (string, string, string) {
		for _, p := range printed {
			if strings.HasPrefix(p.target, target) && p.config == config {
				th := fallback
				if m := thresholdRe.FindString(p.target); m != "" {
					th = m
				}
				met := "yes"
				if p.met != "met" {
					met = "**no**"
				}
				return th + " (" + config + ")", p.judged, met
			}
		}
		e.add(fmt.Errorf("table %q has no target %q for %q", tg.Title, target, config))
		return "", "", ""
	}
	t := &Table{Header: append(append([]string{"per proxied connection, one CPU"}, configs...), "target", "judged: paired per round, median [min–max]", "met")}
	addRow := func(what string, cell func(config string) string, target, targetConfig, fallback string) {
		row := []string{what}
		for _, c := range configs {
			row = append(row, cell(c))
		}
		th, judged, met := verdict(target, targetConfig, fallback)
		t.Rows = append(t.Rows, append(row, th, judged, met))
	}
	addRow("conntrack entries in the pod", func(c string) string { return e.cell(per, "conntrack entries per connection", c) },
		"conntrack entries per connection: 0", "EBPF", "0")
	addRow("connection rate", func(c string) string { return after("connections/s", "vs REDIRECT", c) },
		"connection rate at least REDIRECT's", "EBPF", ">= 1x")
	addRow("chained `intercept` ADD", func(c string) string {
		if strings.Contains(c, "fast path") {
			return ""
		}
		return e.cell(add, "vs REDIRECT", c)
	}, "ADD no slower than REDIRECT's", "EBPF", "<= 1x")
	addRow("app <-> sidecar 64 B round trip", func(c string) string { return after("hop round trip µs", "vs REDIRECT", c) },
		"hop 64 B round trip", "EBPF + fast path", "")
	addRow("app <-> sidecar CPU time per request", func(c string) string { return after("hop CPU µs/request", "vs REDIRECT", c) },
		"CPU time per request, hop 64 B", "EBPF + fast path", "")
	s2s := func(c string) float64 { return e.num(e.cell(per, "sidecar to sidecar µs", c)) }
	addRow("same-node sidecar to sidecar, of the way from REDIRECT to no mesh", func(c string) string {
		d, redir, none := s2s(c), s2s("REDIRECT"), s2s("no interception")
		if redir == none {
			return "n/a"
		}
		return fmt.Sprintf("%.0f%%", 100*(1-math.Abs(d-none)/math.Abs(redir-none)))
	}, "sidecar to sidecar 64 B round trip", "EBPF + fast path", "")
	addRow("sidecar to sidecar CPU time per request", func(c string) string { return after("sidecar to sidecar CPU µs/request", "vs REDIRECT", c) },
		"CPU time per request, sidecar to sidecar 64 B", "EBPF + fast path", "")
	if e.err != nil {
		return "", e.err
	}
	rounds := "?"
	if m := roundsRe.FindStringSubmatch(per.Title); m != nil {
		rounds = m[1]
	}
	placement := "IPv4, " + rounds + " rounds per configuration in alternating order, every process of the path on one CPU"
	return fmt.Sprintf("%s\n\n%s", stamp(r, placement, bench), t.Markdown()), nil
}

// fastpathRoundsRe finds the rounds in the title of BenchmarkFastpath's
// round-trip tables ("median of 10 rounds' medians").
var fastpathRoundsRe = regexp.MustCompile(`median of (\d+) rounds`)

// fastpathBlock is BenchmarkFastpath's targets as it printed them: the
// Istio pod's, both placements, "one CPU" judged and "spread" beside it.
func fastpathBlock(r *Run) (string, error) {
	const bench = "BenchmarkFastpath"
	var e errs
	hop := e.table(r, bench, "fast path, one CPU, the app <-> sidecar hop alone")
	tg := e.table(r, bench, "fast path: targets")
	if e.err != nil {
		return "", e.err
	}
	rounds := "?"
	if m := fastpathRoundsRe.FindStringSubmatch(hop.Title); m != nil {
		rounds = m[1]
	}
	placement := "IPv4, " + rounds + ` rounds per configuration in alternating order, in two placements: "one CPU" (every process of the path on one CPU, judged) and "spread" (where the scheduler puts them)`
	printed, err := readTargets(tg)
	if err != nil {
		return "", err
	}
	var missed []string
	for _, p := range printed {
		if p.met == "NOT MET" {
			missed = append(missed, p.target+" ("+p.config+")")
		}
	}
	verdict := "Every judged target holds in this run."
	if len(missed) > 0 {
		verdict = "Not met in this run: " + strings.Join(missed, "; ") + "."
	}
	t := &Table{Header: tg.Header, Rows: tg.Rows}
	return fmt.Sprintf("%s\n\n%s\n%s", stamp(r, placement, bench), t.Markdown(), verdict), nil
}

// fastpathHeadline is fastpathBlock in short, for the README: a row per
// target, the leading figure of each configuration on one CPU (judged) and
// spread.
func fastpathHeadline(r *Run) (string, error) {
	const bench = "BenchmarkFastpath"
	tg, err := r.Find(bench, "fast path: targets")
	if err != nil {
		return "", err
	}
	printed, err := readTargets(tg)
	if err != nil {
		return "", err
	}
	configs := []string{"REDIRECT + fast path, Istio pod", "TPROXY + fast path, Istio pod"}
	// The median of the paired figures, without its min–max.
	lead := func(cell string) string { f, _, _ := strings.Cut(cell, " ["); return f }
	t := &Table{Header: []string{"target, the Istio pod", "REDIRECT + fast path, one CPU", "TPROXY + fast path, one CPU", "spread (REDIRECT / TPROXY, not judged)"}}
	var order []string
	cells := map[string][]string{}
	for _, p := range printed {
		i := slices.Index(configs, p.config)
		if i < 0 {
			continue
		}
		if _, ok := cells[p.target]; !ok {
			order = append(order, p.target)
			cells[p.target] = make([]string, 2*len(configs))
		}
		one := lead(p.judged)
		switch p.met {
		case "met":
		case "NOT MET":
			one = "**" + one + "** (not met)"
		default:
			one += " (" + p.met + ")"
		}
		cells[p.target][i], cells[p.target][len(configs)+i] = one, lead(p.spread)
	}
	for _, target := range order {
		c := cells[target]
		t.Rows = append(t.Rows, []string{target, c[0], c[1], c[2] + " / " + c[3]})
	}
	return fmt.Sprintf("%s\n\n%s", stamp(r, "IPv4, every process of the path on one CPU (judged, paired per round: the median of each round's figure against the same round's REDIRECT) and spread", bench), t.Markdown()), nil
}

// printedTarget is one row of a benchmark's table of targets.
type printedTarget struct {
	target, config, judged, within, met, groups, medians, spread string
}

// readTargets reads a benchmark's table of targets by its columns' names
// (test/bench's Col... constants).
func readTargets(t *Table) ([]printedTarget, error) {
	cols := []string{mwbench.ColTarget, mwbench.ColConfig, mwbench.ColJudged, mwbench.ColWithin, mwbench.ColMet, mwbench.ColGroups, mwbench.ColMedians, mwbench.ColSpread}
	idx := make([]int, len(cols))
	for i, c := range cols {
		k, err := t.Col(c)
		if err != nil {
			return nil, fmt.Errorf("%v: the output of an older benchmark? (run make bench again)", err)
		}
		idx[i] = k
	}
	var out []printedTarget
	for _, row := range t.Rows {
		cell := func(i int) string {
			if idx[i] < len(row) {
				return row[idx[i]]
			}
			return ""
		}
		out = append(out, printedTarget{cell(0), cell(1), cell(2), cell(3), cell(4), cell(5), cell(6), cell(7)})
	}
	return out, nil
}

// errs keeps the first error of a series of look-ups, so that a block
// reads as a list of look-ups and fails with the first one that failed.
type errs struct{ err error }

func (e *errs) add(err error) {
	if e.err == nil && err != nil {
		e.err = err
	}
}

func (e *errs) table(r *Run, bench, prefix string) *Table {
	t, err := r.Find(bench, prefix)
	e.add(err)
	if t == nil {
		return &Table{Title: prefix}
	}
	return t
}

func (e *errs) cell(t *Table, col string, keys ...string) string {
	c, err := t.Cell(col, keys...)
	e.add(err)
	return c
}

func (e *errs) num(cell string) float64 {
	if e.err != nil {
		return 0
	}
	v, err := num(cell)
	e.add(err)
	return v
}
