// Command gendoc rewrites the generated sections of the docs it is given
// (docs/meshwire.md's flag tables, docs/iptables-init.md's) from the
// commands' flag definitions: each file gets every section whose markers
// it holds. `go generate ./cmd/meshwire/cli ./internal/intercept/flags`
// runs it; test/docs and the flags' tests fail while a section differs
// from the definitions.
package main

import (
	"bytes"
	"fmt"
	"os"

	"github.com/meshwire/meshwire/cmd/meshwire/cli"
	"github.com/meshwire/meshwire/internal/intercept/flags"
)

// sections are the generated sections, by their begin marker.
var sections = []struct {
	begin  string
	splice func(doc []byte) ([]byte, error)
}{
	{cli.FlagTablesBegin, cli.SpliceFlagTables},
	{flags.FlagTableBegin, flags.SpliceFlagTable},
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: gendoc FILE.md...")
		os.Exit(2)
	}
	for _, path := range os.Args[1:] {
		if err := rewrite(path); err != nil {
			fmt.Fprintf(os.Stderr, "gendoc: %s: %v\n", path, err)
			os.Exit(1)
		}
	}
}

// rewrite splices every section whose markers path holds.
func rewrite(path string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	found := false
	for _, s := range sections {
		if !bytes.Contains(doc, []byte(s.begin)) {
			continue
		}
		found = true
		if doc, err = s.splice(doc); err != nil {
			return err
		}
	}
	if !found {
		return fmt.Errorf("no generated section in it")
	}
	return os.WriteFile(path, doc, 0o644)
}
