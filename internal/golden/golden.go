// Package golden compares what a test rendered (iptables-restore payloads,
// nftables scripts) with a reviewed file, testdata/golden/<name>.golden in
// the test's package. It rewrites the files instead when asked:
//
//	MESHWIRE_UPDATE_GOLDEN=1 go test ./internal/intercept ./internal/ipmasq ./plugins/meta/portmap
//
// An environment variable rather than a flag, so that one command line can
// update the golden files of several packages (a -update flag is an error
// in every package that does not define it). Review the diff before
// committing.
package golden

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// EnvUpdate set to 1 makes Check write the golden files instead of
// comparing with them.
const EnvUpdate = "MESHWIRE_UPDATE_GOLDEN"

// Dir is where a package's golden files are, relative to its directory.
var Dir = filepath.Join("testdata", "golden")

// Path is the golden file of name.
func Path(name string) string { return filepath.Join(Dir, name+".golden") }

// Check fails t when got differs from the golden file of name, or writes
// got there when EnvUpdate is 1.
func Check(t testing.TB, name, got string) {
	t.Helper()
	CheckFile(t, Path(name), got)
}

// CheckFile is Check for a golden file at path (relative to the test's
// package), wherever it is: a file of the repository that is generated,
// such as a manifest rendered from a chart.
func CheckFile(t testing.TB, path, got string) {
	t.Helper()
	if os.Getenv(EnvUpdate) == "1" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run the test with %s=1 to create it)", err, EnvUpdate)
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file at %s; review, then rerun with %s=1 to accept\n--- got\n%s\n--- want\n%s",
			path, firstDifference(got, string(want)), EnvUpdate, got, want)
	}
}

// firstDifference names the first line where got and want differ.
func firstDifference(got, want string) string {
	g, w := strings.SplitAfter(got, "\n"), strings.SplitAfter(want, "\n")
	i := 0
	for i < len(g) && i < len(w) && g[i] == w[i] {
		i++
	}
	return fmt.Sprintf("line %d", i+1)
}

// LineDiff lists the lines of a that b lacks, each after aLabel, then the
// lines of b that a lacks, after bLabel: the short diff of two renderings
// whose lines are mostly distinct, such as markdown tables.
func LineDiff(a, b, aLabel, bLabel string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var diff []string
	for _, l := range al {
		if !slices.Contains(bl, l) {
			diff = append(diff, aLabel+l)
		}
	}
	for _, l := range bl {
		if !slices.Contains(al, l) {
			diff = append(diff, bLabel+l)
		}
	}
	return strings.Join(diff, "\n")
}
