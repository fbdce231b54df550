//go:build ignore

// Command gendoc rewrites the flag tables of docs/meshwire.md (the file
// named by its argument) from the meshwire command's flag definitions.
// Run it with `go generate ./cmd/meshwire/cli`; test/docs fails while the
// tables differ from the definitions.
package main

import (
	"github.com/meshwire/meshwire/cmd/meshwire/cli"
	"github.com/meshwire/meshwire/internal/docgen"
)

func main() { docgen.Main(cli.SpliceFlagTables) }
