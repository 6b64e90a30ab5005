// Package fork starts the child processes of the project's tests and programs that must not
// outlive the process that started them: test/harness's processes (controllers, drivers, the
// cluster's components) and test/kubelet's workloads. It imports nothing of the project, so that
// test/kubelet, which test/harness imports, can use it.
package fork

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

type request struct {
	cmd  *exec.Cmd
	done chan error
}

// The kernel sends Pdeathsig when the thread that forked a child ends, not the process; Go may end
// a thread whose goroutine locked it. Forking every child from one locked thread that never ends
// makes them die exactly when this process does, however it ends (a failed test, a timeout's
// panic, SIGKILL). That thread is by nature one per process, hence package state.
var (
	forkerOnce sync.Once
	forks      chan request
)

// Start starts cmd as a child that the kernel kills (SIGKILL) when this process ends, and that
// leads a process group of its own, so that a signal meant for this process's group (Ctrl-C in a
// terminal) does not reach it and the caller decides its fate. cloneflags are the child's clone
// flags: CLONE_NEWNS gives it a mount namespace of its own, as a container runtime does. Start
// sets cmd.SysProcAttr.
func Start(cmd *exec.Cmd, cloneflags uintptr) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Cloneflags: cloneflags}
	forkerOnce.Do(func() {
		forks = make(chan request)
		go func() {
			runtime.LockOSThread()
			for req := range forks {
				req.done <- req.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	forks <- request{cmd: cmd, done: done}
	return <-done
}
