// Command iptables-init programs a pod's network namespace so that every
// inbound and outbound TCP connection goes through the sidecar proxy: the
// istio-iptables command line (same flags, environment variables, defaults
// and meaning), REDIRECT or TPROXY, iptables (legacy or nft) or native
// nftables. It runs as an init container with NET_ADMIN.
package main

import (
	"os"

	"github.com/meshwire/meshwire/internal/intercept/flags"
	"github.com/meshwire/meshwire/internal/killpoint"
)

func main() {
	killpoint.SetCommand("iptables-init")
	os.Exit(Run(os.Args[1:], flags.SystemEnv(), os.Stdout, os.Stderr))
}
