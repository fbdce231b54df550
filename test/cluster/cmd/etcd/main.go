// Command etcd is etcd's own server main (go.etcd.io/etcd/server/v3/etcdmain)
// at the version Kubernetes pins, built in this module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
