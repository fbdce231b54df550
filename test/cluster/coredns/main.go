// Command coredns is CoreDNS's own main at the pinned version, with its
// default plugin set (the cluster's DNS). It is a module of its own: its
// Kubernetes client libraries are older than those of ../go.mod.
package main

import (
	_ "github.com/coredns/coredns/core/plugin" // every in-tree plugin

	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
