// Command meshwire is the suite's command line: it wires named network
// namespaces with CNI conflists through libcni, the way a container runtime
// does (add, check, del, ls, gc), demonstrates the suite (demo), attaches
// the eBPF fast path (fastpath) and installs meshwire on a node (install).
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
