// Command pause is the pod sandbox's process: it sleeps until SIGINT or
// SIGTERM and reaps the children it inherits, like registry.k8s.io/pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
