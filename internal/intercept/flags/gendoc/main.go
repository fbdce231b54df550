// Command gendoc rewrites the flag table of docs/iptables-init.md (the
// file named by its argument) from iptables-init's flag definitions.
// Run it with `go generate ./internal/intercept/flags`.
package main

import (
	"github.com/meshwire/meshwire/internal/docgen"
	"github.com/meshwire/meshwire/internal/intercept/flags"
)

func main() { docgen.Main(flags.SpliceFlagTable) }
