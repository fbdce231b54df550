// Command meshwire wires named network namespaces with CNI conflists through
// libcni, the way a container runtime does, and demonstrates the suite.
package main

import (
	_ "embed"
	"os"

	"github.com/meshwire/meshwire/cmd/meshwire/cli"
)

//go:embed default.conflist
var defaultConflist []byte

func main() {
	os.Exit(cli.Main(os.Args[1:], defaultConflist, os.Stdout, os.Stderr))
}
