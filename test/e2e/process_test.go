package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// processes starts the run's child processes and knows which still run.
//
// Every child gets Pdeathsig: the kernel kills it when the thread that forked it ends. That thread
// is the one of a goroutine locked to it that never returns, so it lives exactly as long as the
// test binary: however the binary ends (a failed test, a timeout's panic, SIGKILL), no controller,
// sidecar or driver outlives it. Each child also leads a process group of its own, so that a
// signal meant for the test binary (Ctrl-C) does not reach it and the tests decide its fate.
type processes struct {
	starts chan startRequest

	mu   sync.Mutex
	live map[*process]struct{}
}

type startRequest struct {
	cmd  *exec.Cmd
	done chan error
}

func newProcesses() *processes {
	ps := &processes{starts: make(chan startRequest), live: map[*process]struct{}{}}
	go func() {
		runtime.LockOSThread()
		for req := range ps.starts {
			req.done <- req.cmd.Start()
		}
	}()
	return ps
}

// process is one running child.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	// exited is closed once the process has exited and been waited for.
	exited chan struct{}
}

// start runs bin with args and the environment env (the test binary's when nil), its output
// going to logPath.
func (ps *processes) start(name, bin string, args, env []string, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	done := make(chan error, 1)
	ps.starts <- startRequest{cmd: cmd, done: done}
	if err := <-done; err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	ps.mu.Lock()
	ps.live[p] = struct{}{}
	ps.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		_ = logFile.Close()
		ps.mu.Lock()
		delete(ps.live, p)
		ps.mu.Unlock()
		close(p.exited)
	}()
	return p, nil
}

// killAll kills every process still running and waits for each to exit.
func (ps *processes) killAll() {
	ps.mu.Lock()
	live := make([]*process, 0, len(ps.live))
	for p := range ps.live {
		live = append(live, p)
	}
	ps.mu.Unlock()
	for _, p := range live {
		_ = p.kill()
	}
}

// running tells whether the process has not exited yet.
func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// signal sends sig to the process; a process that has exited is not signalled.
func (p *process) signal(sig syscall.Signal) error {
	if !p.running() {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: send %v: %w", p.name, sig, err)
	}
	return nil
}

// stop asks the process to end with SIGTERM, as the kubelet does when it deletes a pod, and kills
// it after grace. It returns an error when the process had to be killed.
func (p *process) stop(grace time.Duration) error {
	if !p.running() {
		return nil
	}
	// SIGCONT lets a paused process see the SIGTERM.
	if err := errors.Join(p.signal(syscall.SIGTERM), p.signal(syscall.SIGCONT)); err != nil {
		return err
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
	}
	if err := p.kill(); err != nil {
		return err
	}
	return fmt.Errorf("%s did not stop within %s of SIGTERM and was killed", p.name, grace)
}

// kill ends the process with SIGKILL, with no chance to clean up, and waits for it to exit.
func (p *process) kill() error {
	if err := p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s did not exit within 30s of SIGKILL", p.name)
	}
}

// pause freezes the process with SIGSTOP: its sockets stay open and accept connections, but
// nothing answers. stop and kill end a paused process too.
func (p *process) pause() error { return p.signal(syscall.SIGSTOP) }

// exitStatus describes how the process ended, or says that it runs.
func (p *process) exitStatus() string {
	if p.running() {
		return "running"
	}
	return p.cmd.ProcessState.String()
}

// logTail returns the last n lines of the process's log.
func (p *process) logTail(n int) string {
	return fileTail(p.logPath, n)
}

// logContains tells whether the process's log holds s.
func (p *process) logContains(s string) bool {
	data, err := os.ReadFile(p.logPath)
	return err == nil && strings.Contains(string(data), s)
}

func fileTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = f.Close() }()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
