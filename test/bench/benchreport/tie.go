package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/meshwire/meshwire/internal/golden"
)

// Every table the documents hold is tied to the output it was written
// from: `make bench-report` keeps that output, compressed, as
// docs/bench/COMMIT.txt.gz (COMMIT is the full hash the run measured), and
// verify writes every block again from it and compares.

// untied are the runs whose tables the documents held before their output
// was kept (docs/bench/ came after them). Their blocks are not verified;
// an entry no document names any more is refused (TestUntiedRunsNamed),
// so the list empties as stated runs replace them.
var untied = map[string]string{}

// readRun parses the output in path, plain or gzip-compressed, of a run
// that finished; to publish, of a clean tree.
func readRun(path string, publish bool) (*Run, error) {
	data, err := readOutput(path)
	if err != nil {
		return nil, err
	}
	r, err := Parse(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	check := r.CheckFinished
	if publish {
		check = r.Check
	}
	if err := check(); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return r, nil
}

func readOutput(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%v (run make bench first)", err)
	}
	if !strings.HasSuffix(path, ".gz") {
		return data, nil
	}
	z, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return io.ReadAll(z)
}

// keptName is the file in dir that keeps the output of the run at commit.
func keptName(dir, commit string) string { return filepath.Join(dir, commit+".txt.gz") }

// keep writes the output data of the run at commit into dir, compressed
// the same way every time (no name, no date in the gzip header).
func keep(dir, commit string, data []byte) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	var b bytes.Buffer
	z, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
	if err != nil {
		return "", err
	}
	if _, err := z.Write(data); err != nil {
		return "", err
	}
	if err := z.Close(); err != nil {
		return "", err
	}
	name := keptName(dir, commit)
	return name, os.WriteFile(name, b.Bytes(), 0o644)
}

var (
	// stampRe finds the run a block names: its stamp, or the run
	// paragraph.
	stampRe = regexp.MustCompile("\\*`make [a-z-]+` at ([0-9a-f]{7,40}), |`make bench` run at commit ([0-9a-f]{7,40}) ")
)

// blockRuns lists the runs (short commits) the bench blocks of doc name,
// each once, in order, and counts the blocks.
func blockRuns(doc string) (runs []string, blocks int) {
	open := false
	for _, l := range strings.Split(doc, "\n") {
		if m := marker.FindStringSubmatch(l); m != nil {
			open = m[1] == ""
			if open {
				blocks++
			}
			continue
		}
		if !open {
			continue
		}
		for _, m := range stampRe.FindAllStringSubmatch(l, -1) {
			if c := m[1] + m[2]; !slices.Contains(runs, c) {
				runs = append(runs, c)
			}
		}
	}
	return runs, blocks
}

// verify checks that every bench block of the document in path is what
// the kept output of its run writes, and returns the run; an untied run
// is named, not verified.
func verify(path, dir string) (run string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	doc := string(data)
	runs, blocks := blockRuns(doc)
	switch {
	case blocks == 0:
		return "", fmt.Errorf("%s: no <!-- bench:NAME --> block", path)
	case len(runs) == 0:
		return "", fmt.Errorf("%s: no block names its run", path)
	case len(runs) > 1:
		return "", fmt.Errorf("%s: blocks from %d runs (%s): make bench-report writes a document from one", path, len(runs), strings.Join(runs, ", "))
	}
	run = runs[0]
	kept, _ := filepath.Glob(filepath.Join(dir, run+"*.txt.gz"))
	switch {
	case len(kept) == 0 && untied[run] != "":
		return run, nil
	case len(kept) == 0:
		return "", fmt.Errorf("%s: its tables come from the run at %s, whose output is not in %s: they are tied to nothing (make bench-report keeps it)", path, run, dir)
	case len(kept) > 1:
		return "", fmt.Errorf("%s: %d outputs in %s match the run %s", path, len(kept), dir, run)
	}
	r, err := readRun(kept[0], true)
	if err != nil {
		return "", err
	}
	if filepath.Base(kept[0]) != r.Commit+".txt.gz" {
		return "", fmt.Errorf("%s holds the output of the run at %s", kept[0], r.Commit)
	}
	again, _, err := Rewrite(doc, r)
	if err != nil {
		return "", fmt.Errorf("%s, from %s: %v", path, kept[0], err)
	}
	if again != doc {
		return "", fmt.Errorf("%s: its tables are not what %s writes (edited by hand, or written from another output):\n%s", path, kept[0], lineDiff(doc, again))
	}
	return run, nil
}

// lineDiff lists the lines of the document that the output does not
// write, and those it writes that the document lacks.
func lineDiff(doc, fromOutput string) string {
	return golden.LineDiff(doc, fromOutput, "  in the document: ", "  from the output: ")
}
