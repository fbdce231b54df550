// Command benchreport writes the benchmark tables of the README,
// docs/performance.md and docs/fastpath.md from the output of one `make
// bench` (or `make bench-fastpath`) run, so that every published figure
// comes from that run, as it printed it or computed from what it printed,
// with the run's commit and date above it; it keeps that output beside
// the documents, checks that their tables are what it writes, and judges
// the run's stated targets.
//
//	benchreport [-in bench.out] [-keep docs/bench] FILE...   (make bench-report)
//	benchreport -check [-min-rounds 10] [-in bench.out]      (make bench-check)
//	benchreport -verify docs/bench FILE...
//
// In each FILE it replaces what lies between <!-- bench:NAME --> and
// <!-- /bench:NAME --> with the block NAME (blocks.go). It refuses a run
// made from a dirty tree, one that did not finish or ended in an error no
// benchmark reported, and one that lacks a table a block needs or whose
// benchmark failed; then it changes no file. With -keep it writes the
// output, compressed, to DIR/COMMIT.txt.gz (tie.go).
//
// -check prints every stated target of the run with its verdict (check.go)
// and exits 1 when one is missed, 2 when the output cannot be judged.
// -verify writes every block of each FILE again from the kept output of the
// run it names and exits 1 when one differs.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

func main() {
	in := flag.String("in", "bench.out", "the output of make bench (or make bench-fastpath), plain or .gz")
	keepDir := flag.String("keep", "", "keep the output, compressed, as `DIR`/COMMIT.txt.gz once the files are written")
	judge := flag.Bool("check", false, "judge the run's stated targets: exit 1 when one is missed")
	minRounds := flag.Int("min-rounds", 10, "with -check: the fewest rounds the fast path's and EBPF mode's paired figures are judged on")
	verifyDir := flag.String("verify", "", "check that every table of the FILEs is what the output kept in `DIR` writes")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: benchreport [-in bench.out] [-keep DIR] FILE...\n       benchreport -check [-min-rounds N] [-in bench.out]\n       benchreport -verify DIR FILE...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	switch {
	case *judge:
		if flag.NArg() != 0 {
			flag.Usage()
			os.Exit(2)
		}
		missed, err := check(*in, *minRounds, os.Stdout)
		if err != nil {
			fmt.Fprintf(os.Stderr, "benchreport: %v\n", err)
			os.Exit(2)
		}
		if missed > 0 {
			os.Exit(1)
		}
	case *verifyDir != "":
		if flag.NArg() == 0 {
			flag.Usage()
			os.Exit(2)
		}
		failed := false
		for _, f := range flag.Args() {
			run, err := verify(f, *verifyDir)
			switch {
			case err != nil:
				fmt.Fprintf(os.Stderr, "benchreport: %v\n", err)
				failed = true
			case untied[run] != "":
				fmt.Printf("%s: from the run at %s, %s: not verified\n", f, run, untied[run])
			default:
				fmt.Printf("%s: every table is what the run at %s wrote\n", f, run)
			}
		}
		if failed {
			os.Exit(1)
		}
	default:
		if flag.NArg() == 0 {
			flag.Usage()
			os.Exit(2)
		}
		if err := report(*in, *keepDir, flag.Args(), os.Stdout, os.Stderr); err != nil {
			fmt.Fprintf(os.Stderr, "benchreport: %v\n", err)
			os.Exit(1)
		}
	}
}

// report rewrites files from the run in path: all of them, or none; it
// says what it wrote on stdout, and warns on stderr. With keepDir it then
// keeps the output there.
func report(path, keepDir string, files []string, stdout, stderr io.Writer) error {
	data, err := readOutput(path)
	if err != nil {
		return err
	}
	r, err := Parse(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	if err := r.Check(); err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	for _, b := range r.Failed() {
		fmt.Fprintf(stderr, "benchreport: warning: %s failed in this run: its tables are not published\n", b)
	}
	out := map[string]string{}
	for _, name := range files {
		doc, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		text, written, err := Rewrite(string(doc), r)
		if err != nil {
			return fmt.Errorf("%s: %v", name, err)
		}
		if len(written) == 0 {
			return fmt.Errorf("%s: no <!-- bench:NAME --> marker", name)
		}
		out[name] = text
		fmt.Fprintf(stdout, "%s: %s\n", name, strings.Join(written, ", "))
	}
	for _, name := range files {
		if err := os.WriteFile(name, []byte(out[name]), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "from the run at %s, %s\n", short(r.Commit), r.Started.UTC().Format("2006-01-02 15:04 MST"))
	if keepDir != "" {
		kept, err := keep(keepDir, r.Commit, data)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "its output: %s (commit it with the tables)\n", kept)
	}
	return nil
}
