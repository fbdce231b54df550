// Command benchreport writes the benchmark tables of the README and
// docs/performance.md from the output of one `make bench` run (`make
// bench-report`), so that every published figure comes from that run, as
// it printed it or computed from what it printed, with the run's commit
// and date above it.
//
//	benchreport [-in bench.out] FILE...
//
// In each FILE it replaces what lies between <!-- bench:NAME --> and
// <!-- /bench:NAME --> with the block NAME (blocks.go). It refuses a run
// made from a dirty tree, one that did not finish or ended in an error no
// benchmark reported, and one that lacks a table a block needs or whose
// benchmark failed; then it changes no file.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

func main() {
	in := flag.String("in", "bench.out", "the output of make bench")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: benchreport [-in bench.out] FILE...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := report(*in, flag.Args(), os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "benchreport: %v\n", err)
		os.Exit(1)
	}
}

// report rewrites files from the run in path: all of them, or none; it
// says what it wrote on stdout, and warns on stderr.
func report(path string, files []string, stdout, stderr io.Writer) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%v (run make bench first)", err)
	}
	defer f.Close()
	r, err := Parse(f)
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
	return nil
}
