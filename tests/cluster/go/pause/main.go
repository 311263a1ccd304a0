// Command pause is the test node's pod sandbox: it holds the pod's namespaces
// and exits on SIGTERM/SIGINT, like registry.k8s.io/pause (which cannot be
// pulled here). Built by tests/cluster/image.sh, never shipped.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	// Reap zombies when it is PID 1 of a pod that shares its PID namespace.
	signal.Ignore(syscall.SIGCHLD)
	<-sig
}
