//go:build ignore

// Command gendoc rewrites the flag tables of docs/meshwire.md (the file
// named by its argument) from the meshwire command's flag definitions.
// Run it with `go generate ./cmd/meshwire/cli`; test/docs fails while the
// tables differ from the definitions.
package main

import (
	"fmt"
	"os"

	"github.com/meshwire/meshwire/cmd/meshwire/cli"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gendoc FILE.md")
		os.Exit(2)
	}
	path := os.Args[1]
	doc, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gendoc:", err)
		os.Exit(1)
	}
	out, err := cli.SpliceFlagTables(doc)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gendoc: %s: %v\n", path, err)
		os.Exit(1)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "gendoc:", err)
		os.Exit(1)
	}
}
