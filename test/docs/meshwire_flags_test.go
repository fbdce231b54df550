package docs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/meshwire/meshwire/cmd/meshwire/cli"
)

// TestMeshwireFlagTables: the flag tables of docs/meshwire.md are what the
// command definitions produce (regenerate: go generate ./cmd/meshwire/cli).
func TestMeshwireFlagTables(t *testing.T) {
	path := filepath.Join(root, "docs", "meshwire.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := cli.SpliceFlagTables(doc)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if string(want) == string(doc) {
		return
	}
	t.Fatalf("docs/meshwire.md's flag tables differ from the command definitions; run `go generate ./cmd/meshwire/cli` and commit the result:\n%s", lineDiff(string(doc), string(want)))
}

// TestMeshwireFlagsDocumented: every flag of every meshwire command says
// what it means, in a form the tables can hold; every command says what
// it does.
func TestMeshwireFlagsDocumented(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden {
			return
		}
		if strings.TrimSpace(c.Short) == "" {
			t.Errorf("%s has no description (Short)", c.CommandPath())
		}
		check := func(f *pflag.Flag) {
			if len(strings.Fields(f.Usage)) < 2 {
				t.Errorf("%s --%s has no documentation (its usage %q)", c.CommandPath(), f.Name, f.Usage)
			}
			if strings.Contains(f.Usage, "\n") {
				t.Errorf("%s --%s: a newline in its usage would break the table", c.CommandPath(), f.Name)
			}
		}
		c.LocalFlags().VisitAll(check)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(cli.Commands())
}
