package cli

//go:generate go run ../../../internal/gendoc ../../../docs/meshwire.md

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/meshwire/meshwire/internal/docgen"
)

// Markers around the generated flag tables in docs/meshwire.md.
const (
	FlagTablesBegin = "<!-- BEGIN flag tables: generated from cmd/meshwire/cli by `go generate ./cmd/meshwire/cli`; do not edit -->"
	FlagTablesEnd   = "<!-- END flag tables -->"
)

// Commands returns meshwire's command tree, for the docs and their tests.
func Commands() *cobra.Command {
	return newRoot(&env{out: io.Discard, errOut: io.Discard, stateDir: defaultStateDir})
}

// MarkdownFlagTables renders the flags of every command as markdown: the
// global flags, then a table per command with flags of its own, then the
// commands without any (but -h/--help, which every command has).
func MarkdownFlagTables() string {
	root := Commands()
	var b strings.Builder
	_, global := flagGroups(root)
	b.WriteString("### Global flags\n\nBefore or after the command, on every command.\n\n")
	writeFlagTable(&b, global)
	var flagless []string
	walk(root, func(c *cobra.Command) {
		if !c.HasParent() || c.Hidden {
			return
		}
		own, _ := flagGroups(c)
		var shown []*pflag.Flag
		for _, f := range own {
			if f.Name != "help" {
				shown = append(shown, f)
			}
		}
		if len(shown) == 0 {
			flagless = append(flagless, "`"+commandName(c)+"`")
			return
		}
		fmt.Fprintf(&b, "### `meshwire %s`\n\n`%s`\n\n%s.\n\n", commandName(c), c.UseLine(), sentence(c.Short))
		writeFlagTable(&b, shown)
	})
	fmt.Fprintf(&b, "%s take no flags of their own. Every command also takes `-h`, `--help`, which prints its usage.\n",
		joinAnd(flagless))
	return b.String()
}

func writeFlagTable(b *strings.Builder, flags []*pflag.Flag) {
	b.WriteString("| flag | default | same as | meaning |\n|---|---|---|---|\n")
	for _, f := range flags {
		i := describeFlag(f)
		names := "`" + i.names() + "`"
		def := "`" + i.def + "`"
		if i.def == "none" || strings.Contains(i.def, " ") {
			def = i.def
		}
		same := i.same
		if same == "" {
			same = "none"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", cell(names), cell(def), cell(same), cell(i.meaning))
	}
	b.WriteString("\n")
}

// cell escapes the table separator.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// joinAnd is "a, b and c".
func joinAnd(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// SpliceFlagTables returns doc with the text between FlagTablesBegin and
// FlagTablesEnd replaced by MarkdownFlagTables.
func SpliceFlagTables(doc []byte) ([]byte, error) {
	return docgen.Splice(doc, FlagTablesBegin, FlagTablesEnd, MarkdownFlagTables())
}
