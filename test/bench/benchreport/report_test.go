package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/doc.golden.md")

// sample is testdata/sample-bench.txt: real `make bench` output, cut down to the
// header, the benchmarks' result lines and the tables the documents use
// (the run at d192f93), with BenchmarkCapture's and BenchmarkFastpath's
// output in full from a later run in their present format
// (testdata/fastpath-run.txt.gz, 2 rounds, made before the paired median
// of an even count became the mean of the middle two: its verdicts are
// what that build printed).
func sample(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("testdata/sample-bench.txt")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func parse(t *testing.T, text string) *Run {
	t.Helper()
	r, err := Parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParse(t *testing.T) {
	r := parse(t, sample(t))
	if err := r.Check(); err != nil {
		t.Fatal(err)
	}
	// The sampled run's BenchmarkFullNode failed a bound; go test exited 1.
	if f := r.Failed(); len(f) != 1 || f[0] != "BenchmarkFullNode" {
		t.Errorf("failed: %v, want BenchmarkFullNode", f)
	}
	if len(r.Commit) != 40 || r.Tree != "clean" || r.Exit != "1" || !r.Finished.After(r.Started) || r.Machine == "" {
		t.Errorf("header: commit %q tree %q exit %q started %v finished %v machine %q", r.Commit, r.Tree, r.Exit, r.Started, r.Finished, r.Machine)
	}
	for _, b := range []string{"BenchmarkBandwidth", "BenchmarkBridge", "BenchmarkCapture", "BenchmarkHostLocal", "BenchmarkIntercept", "BenchmarkPortmap"} {
		if r.Results[b] != "ok" {
			t.Errorf("%s: %q, want ok", b, r.Results[b])
		}
	}
	br, err := r.Find("BenchmarkBridge", "bridge + host-local: ")
	if err != nil {
		t.Fatal(err)
	}
	// A table prints back as the benchmark printed it.
	if want := "### " + br.Title + "\n\n" + br.Markdown(); !strings.Contains(sample(t), want) {
		t.Errorf("the bridge table does not print back as it was read:\n%s", want)
	}
	if c, err := br.Cell("vs v1.9.1", "DEL", "20"); err != nil || !strings.HasSuffix(c, "x") {
		t.Errorf("bridge DEL 20 vs v1.9.1 = %q, %v", c, err)
	}
}

// TestRefuse: output that must not be published is refused, naming why.
func TestRefuse(t *testing.T) {
	s := sample(t)
	for _, c := range []struct {
		name, old, new, want string
	}{
		{"dirty tree", "meshwire-bench: tree clean", "meshwire-bench: tree dirty", "dirty tree"},
		{"no commit", "meshwire-bench: commit ", "x: ", "not the output of `make bench`"},
		{"unfinished", "meshwire-bench: exit 1", "", "did not finish"},
		{"no failure reported", "--- FAIL: BenchmarkFullNode", "--- BENCH: BenchmarkFullNode", "status 1 and no benchmark reported a failure"},
	} {
		t.Run(c.name, func(t *testing.T) {
			text := strings.Replace(s, c.old, c.new, 1)
			if text == s {
				t.Fatalf("%q is not in the sample", c.old)
			}
			err := parse(t, text).Check()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Check() = %v, want an error with %q", err, c.want)
			}
		})
	}
}

// TestMissingTable: a block whose table is not in the output fails and
// names the benchmark to run.
func TestMissingTable(t *testing.T) {
	s := sample(t)
	i := strings.Index(s, "### bridge + host-local: ")
	if i < 0 {
		t.Fatal("no bridge table in the sample")
	}
	s = s[:i] + strings.Replace(s[i:], "### bridge", "### not bridge", 1)
	r := parse(t, s)
	for _, name := range []string{"bridge", "targets"} {
		_, _, err := Rewrite("<!-- bench:"+name+" -->\n<!-- /bench:"+name+" -->\n", r)
		if err == nil || !strings.Contains(err.Error(), "make bench BENCH=BenchmarkBridge") {
			t.Errorf("bench:%s without the bridge table: %v", name, err)
		}
	}
}

func TestMarkers(t *testing.T) {
	r := parse(t, sample(t))
	for _, c := range []struct{ doc, want string }{
		{"<!-- bench:nothing -->\n<!-- /bench:nothing -->\n", "unknown block bench:nothing"},
		{"a\n<!-- bench:bridge -->\nold\n", "line 2: bench:bridge has no end marker"},
		{"<!-- bench:bridge -->\n<!-- bench:portmap -->\n", "begins inside bench:bridge"},
		{"<!-- /bench:bridge -->\n", "ends no open block"},
	} {
		if _, _, err := Rewrite(c.doc, r); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Rewrite(%q) = %v, want an error with %q", c.doc, err, c.want)
		}
	}
}

// TestGolden: every block, written into a document, against the reviewed
// result; writing again changes nothing.
func TestGolden(t *testing.T) {
	r := parse(t, sample(t))
	var doc strings.Builder
	doc.WriteString("# every block\n\nText outside stays.\n\n")
	for _, name := range []string{"run", "targets", "capture", "fastpath", "fastpath-headline", "hostlocal-add", "hostlocal-del", "hostlocal-upgrade", "bridge",
		"portmap", "portmap-mapped", "portmap-nftables", "bandwidth-throughput", "bandwidth-ping", "iptables-init", "intercept-rtt", "intercept-throughput"} {
		doc.WriteString("<!-- bench:" + name + " -->\nan old table\n<!-- /bench:" + name + " -->\n\n")
	}
	got, names, err := Rewrite(doc.String(), r)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 17 {
		t.Errorf("wrote %d blocks: %v", len(names), names)
	}
	if strings.Contains(got, "an old table") {
		t.Error("an old table is left")
	}
	again, _, err := Rewrite(got, r)
	if err != nil || again != got {
		t.Errorf("a second rewrite changed the document (%v)", err)
	}
	golden := filepath.Join("testdata", "doc.golden.md")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("the blocks differ from %s (go test -update to rewrite it, then review):\n%s", golden, got)
	}
}

// docs are the documents make bench-report writes (REPORT_DOCS).
var docs = []string{"../../../README.md", "../../../docs/performance.md", "../../../docs/fastpath.md"}

// keptDir is where make bench-report keeps the outputs (-keep).
const keptDir = "../../../docs/bench"

// TestDocs: the README, docs/performance.md and docs/fastpath.md hold only
// blocks the tool knows, each with its end, and the sample has every table
// they need.
func TestDocs(t *testing.T) {
	r := parse(t, sample(t))
	for _, f := range docs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, names, err := Rewrite(string(b), r); err != nil || len(names) == 0 {
			t.Errorf("%s: %v (blocks %v)", f, err, names)
		}
	}
}

// TestReportAllOrNothing: when one file cannot be written, none is.
func TestReportAllOrNothing(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "bench.out")
	good := filepath.Join(dir, "good.md")
	bad := filepath.Join(dir, "bad.md")
	for f, text := range map[string]string{
		out:  sample(t),
		good: "<!-- bench:bridge -->\n<!-- /bench:bridge -->\n",
		bad:  "<!-- bench:bridge -->\n",
	} {
		if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := report(out, "", []string{good, bad}, io.Discard, io.Discard); err == nil {
		t.Fatal("report with a broken file succeeded")
	}
	if b, _ := os.ReadFile(good); string(b) != "<!-- bench:bridge -->\n<!-- /bench:bridge -->\n" {
		t.Errorf("good.md was written:\n%s", b)
	}
	if err := report(out, "", []string{good}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(good); !strings.Contains(string(b), "| ADD | 1 |") {
		t.Errorf("good.md was not written:\n%s", b)
	}
}

// TestFailedBenchmark: the tables of a benchmark that failed are refused
// even when it printed them, and the run's paragraph names it.
func TestFailedBenchmark(t *testing.T) {
	s := strings.Replace(sample(t), "meshwire-bench: exit", "--- FAIL: BenchmarkBridge\n    bridge_bench_test.go:1: a bound\nmeshwire-bench: exit", 1)
	r := parse(t, s)
	if err := r.Check(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Rewrite("<!-- bench:bridge -->\n<!-- /bench:bridge -->\n", r); err == nil || !strings.Contains(err.Error(), "BenchmarkBridge failed in this run") {
		t.Errorf("bench:bridge of a failed BenchmarkBridge: %v", err)
	}
	if _, _, err := Rewrite("<!-- bench:hostlocal-add -->\n<!-- /bench:hostlocal-add -->\n", r); err != nil {
		t.Errorf("bench:hostlocal-add beside a failed BenchmarkBridge: %v", err)
	}
	text, err := runBlock(r)
	if err != nil || !strings.Contains(text, "Failed in this run: ") || !strings.Contains(text, "BenchmarkBridge") {
		t.Errorf("run block = %q, %v", text, err)
	}
}

// TestDocsTiedToRuns: every table of the documents is what the kept output
// of the run it names writes (docs/bench/COMMIT.txt.gz), but the untied
// runs'.
func TestDocsTiedToRuns(t *testing.T) {
	for _, f := range docs {
		run, err := verify(f, keptDir)
		if err != nil {
			t.Error(err)
			continue
		}
		if untied[run] != "" {
			t.Logf("%s: from the run at %s, %s: not verified", f, run, untied[run])
		}
	}
}

// TestUntiedRunsNamed: an untied run is one a document still names, whose
// output is not kept: the entry goes once a stated run replaces it.
func TestUntiedRunsNamed(t *testing.T) {
	named := map[string]bool{}
	for _, f := range docs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		runs, _ := blockRuns(string(b))
		for _, r := range runs {
			named[r] = true
		}
	}
	for run := range untied {
		if !named[run] {
			t.Errorf("untied has %s, which no document names: remove it", run)
		}
		if kept, _ := filepath.Glob(filepath.Join(keptDir, run+"*.txt.gz")); len(kept) > 0 {
			t.Errorf("untied has %s, whose output is kept (%s): remove it", run, kept[0])
		}
	}
}

// TestVerify: a table edited by hand, a document from two runs or from a
// run whose output is not kept, and one whose kept output says another
// commit are refused; what the kept output writes passes.
func TestVerify(t *testing.T) {
	dir := t.TempDir()
	r := parse(t, sample(t))
	kept, err := keep(dir, r.Commit, []byte(sample(t)))
	if err != nil {
		t.Fatal(err)
	}
	if back, err := readOutput(kept); err != nil || string(back) != sample(t) {
		t.Fatalf("the kept output does not read back: %v", err)
	}
	again, err := keep(t.TempDir(), r.Commit, []byte(sample(t)))
	if err != nil {
		t.Fatal(err)
	}
	if a, b := mustRead(t, kept), mustRead(t, again); a != b {
		t.Error("keeping the same output twice wrote two different files")
	}
	good, _, err := Rewrite("# a page\n\n<!-- bench:bridge -->\n<!-- /bench:bridge -->\n\n<!-- bench:run -->\n<!-- /bench:run -->\n", r)
	if err != nil {
		t.Fatal(err)
	}
	doc := filepath.Join(dir, "doc.md")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(doc, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(good)
	if run, err := verify(doc, dir); err != nil || run != short(r.Commit) {
		t.Errorf("verify of what the output writes = %q, %v", run, err)
	}
	for name, c := range map[string]struct{ text, want string }{
		"a figure edited": {strings.Replace(good, "| ADD | 1 |", "| ADD | 1 | 0.01", 1), "not what"},
		"another run":     {strings.Replace(good, "`make bench` at "+short(r.Commit), "`make bench` at 0123456", 1), "blocks from 2 runs"},
		"no output kept":  {strings.ReplaceAll(good, short(r.Commit), "0123456"), "tied to nothing"},
		"no block":        {"# a page\n", "no <!-- bench:NAME --> block"},
	} {
		write(c.text)
		if _, err := verify(doc, dir); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: verify = %v, want an error with %q", name, err, c.want)
		}
	}
	write(good)
	if err := os.Rename(kept, keptName(dir, short(r.Commit)+strings.Repeat("0", 33))); err != nil {
		t.Fatal(err)
	}
	if _, err := verify(doc, dir); err == nil || !strings.Contains(err.Error(), "holds the output of the run at") {
		t.Errorf("verify of an output kept under another commit's name: %v", err)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// fastpathRun is testdata/fastpath-run.txt.gz: a whole `make bench-fastpath
// ROUNDS=2` output (a dirty tree).
func fastpathRun(t *testing.T) string {
	t.Helper()
	b, err := readOutput("testdata/fastpath-run.txt.gz")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// countMissed counts the rows judged and missed.
func countMissed(rows []verdictRow) (judged, missed int) {
	for _, v := range rows {
		judged++
		if !v.met {
			missed++
		}
	}
	return judged, missed
}

// TestCheck: bench-check judges every stated target of a run: the
// plugins' from their tables, the fast path's and EBPF mode's as their
// benchmarks printed them, from enough rounds; a failed benchmark is a
// miss, and one target missed is enough to fail.
func TestCheck(t *testing.T) {
	s := sample(t)
	if _, err := judgeRun(parse(t, s), 10); err == nil || !strings.Contains(err.Error(), "ran 2 rounds: its targets are judged on at least 10") {
		t.Errorf("2 rounds judged on 10: %v", err)
	}
	rows, err := judgeRun(parse(t, s), 2)
	if err != nil {
		t.Fatal(err)
	}
	byBench := map[string][2]int{}
	for _, v := range rows {
		c := byBench[v.bench]
		c[0]++
		if !v.met {
			c[1]++
		}
		byBench[v.bench] = c
	}
	notMet := func(prefix string) int {
		tab, err := parse(t, s).Find("", prefix)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, p := range must(readTargets(tab)) {
			if p.met == "NOT MET" {
				n++
			}
		}
		return n
	}
	// The sampled run: every plugin target met, BenchmarkFullNode failed.
	if c := byBench["plugins"]; c[0] != 7 || c[1] != 0 {
		t.Errorf("plugins: %d judged, %d missed; want 7, 0", c[0], c[1])
	}
	if c := byBench["BenchmarkFullNode"]; c != [2]int{1, 1} {
		t.Errorf("BenchmarkFullNode: %v, want its failure as one miss", c)
	}
	if c := byBench["BenchmarkFastpath"]; c[0] != 14 || c[1] != notMet("fast path: targets") {
		t.Errorf("BenchmarkFastpath: %v, want 14 judged (2 not judged left out), %d missed", c, notMet("fast path: targets"))
	}
	if c := byBench["BenchmarkCapture"]; c[0] != 9 || c[1] != notMet("EBPF interception: targets") {
		t.Errorf("BenchmarkCapture: %v, want 9 judged, %d missed", c, notMet("EBPF interception: targets"))
	}

	// A deliberate miss: bridge's DEL one at a time at 0.90x of v1.9.1's
	// (target <= 0.3x).
	i := strings.Index(s, "| DEL | 1 |")
	line := s[i : i+strings.Index(s[i:], "\n")]
	cells := strings.Split(line, " | ")
	cells[len(cells)-2] = "0.90x"
	missed := strings.Replace(s, line, strings.Join(cells, " | "), 1)
	rows, err = judgeRun(parse(t, missed), 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rows {
		if v.bench == "plugins" && strings.HasPrefix(v.target, "bridge + host-local DEL") && v.met {
			t.Errorf("bridge DEL at 0.90x judged met: %+v", v)
		}
	}

	// check: the verdicts, and how many missed, from a file.
	dir := t.TempDir()
	out := filepath.Join(dir, "bench.out")
	if err := os.WriteFile(out, []byte(missed), 0o644); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	n, err := check(out, 2, &b)
	_, want := countMissed(rows)
	if err != nil || n != want || !strings.Contains(b.String(), fmt.Sprintf("bench-check: %d of %d targets missed", want, len(rows))) {
		t.Errorf("check = %d, %v, want %d missed:\n%s", n, err, want, b.String())
	}

	// A plugin benchmark that failed is a miss, and the plugins' targets
	// are left to the full run; so are they when some did not run.
	failedBridge := strings.Replace(s, "meshwire-bench: exit", "--- FAIL: BenchmarkBridge\n    bridge_bench_test.go:1: a bound\nmeshwire-bench: exit", 1)
	rows, err = judgeRun(parse(t, failedBridge), 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rows {
		if v.bench == "plugins" {
			t.Errorf("a plugin target judged beside a failed BenchmarkBridge: %+v", v)
		}
	}
	if !slices.ContainsFunc(rows, func(v verdictRow) bool { return v.bench == "BenchmarkBridge" && !v.met }) {
		t.Error("the failed BenchmarkBridge is not a miss")
	}

	// Output with no stated target is not judged.
	bare := "meshwire-bench: commit " + strings.Repeat("a", 40) + "\nmeshwire-bench: tree clean\nmeshwire-bench: started 2026-11-28T06:08:35Z\nBenchmarkFoo-2 1 1 ns/op\nmeshwire-bench: exit 0\nmeshwire-bench: finished 2026-11-28T06:09:35Z\n"
	if _, err := judgeRun(parse(t, bare), 2); err != errNothingJudged {
		t.Errorf("no target: %v", err)
	}
}

// TestFastpathRun: make bench-fastpath's output has the header of make
// bench's, names its target, is judged by bench-check and writes
// fastpath.md's table (from a clean tree); the README's blocks need the
// plugins' tables it lacks.
func TestFastpathRun(t *testing.T) {
	s := fastpathRun(t)
	r := parse(t, s)
	if r.Target != "bench-fastpath" || r.Tree != "dirty" || r.Check() == nil || r.CheckFinished() != nil {
		t.Fatalf("target %q, tree %q, Check %v, CheckFinished %v", r.Target, r.Tree, r.Check(), r.CheckFinished())
	}
	rows, err := judgeRun(r, 2)
	if err != nil {
		t.Fatal(err)
	}
	if judged, missed := countMissed(rows); judged != 23 || missed == 0 {
		t.Errorf("%d judged, %d missed: want 23, some", judged, missed)
	}
	clean := parse(t, strings.Replace(s, "meshwire-bench: tree dirty", "meshwire-bench: tree clean", 1))
	text, _, err := Rewrite("<!-- bench:fastpath -->\n<!-- /bench:fastpath -->\n", clean)
	if err != nil || !strings.Contains(text, "*`make bench-fastpath` at bd44928, 2026-11-28;") {
		t.Errorf("bench:fastpath from make bench-fastpath: %v\n%s", err, text)
	}
	if _, _, err := Rewrite("<!-- bench:targets -->\n<!-- /bench:targets -->\n", clean); err == nil {
		t.Error("the plugins' targets written from a run without their benchmarks")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
