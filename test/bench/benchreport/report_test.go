package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/doc.golden.md")

// sample is testdata/sample-bench.txt: real `make bench` output, cut down to the
// header, the benchmarks' result lines and the tables the documents use.
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

// TestDocs: the README and docs/performance.md hold only blocks the tool
// knows, each with its end, and the sample has every table they need.
func TestDocs(t *testing.T) {
	r := parse(t, sample(t))
	for _, f := range []string{"../../../README.md", "../../../docs/performance.md"} {
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
	if err := report(out, []string{good, bad}, io.Discard, io.Discard); err == nil {
		t.Fatal("report with a broken file succeeded")
	}
	if b, _ := os.ReadFile(good); string(b) != "<!-- bench:bridge -->\n<!-- /bench:bridge -->\n" {
		t.Errorf("good.md was written:\n%s", b)
	}
	if err := report(out, []string{good}, io.Discard, io.Discard); err != nil {
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
