// Command pause is the process of a pod's sandbox on the real-cluster test node: it holds the
// pod's namespaces and does nothing else until it is told to stop. As PID 1 of the pod's PID
// namespace (when the pod shares one) it also reaps the orphans it inherits.
//
// It owns the sandbox's life and nothing else: hack/images --cluster-images builds it into the
// node's pause image. It imports nothing of volume-healer and must not: a pause image holds only
// the pause process.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			os.Exit(0)
		case <-children:
			for {
				var status syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
