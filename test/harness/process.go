package harness

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/procfs"

	"github.com/volume-healer/volume-healer/test/harness/fork"
)

// Processes starts child processes and knows which of them still run.
//
// Every child is started by fork.Start: however this process ends (a failed test, a timeout's
// panic, SIGKILL), no controller, sidecar or driver outlives it; and each leads a process group of
// its own, so that a signal meant for this process (Ctrl-C in a terminal) does not reach it and
// the caller decides its fate.
type Processes struct {
	mu   sync.Mutex
	live map[*Process]struct{}
}

// NewProcesses returns an empty register.
func NewProcesses() *Processes {
	return &Processes{live: map[*Process]struct{}{}}
}

// Process is one running child.
type Process struct {
	// Name names the process in messages.
	Name string
	// LogPath is the file its standard output and error go to.
	LogPath string

	cmd *exec.Cmd
	// exited is closed once the process has exited and been waited for.
	exited chan struct{}
}

// Start runs bin with args and the environment env (this process's when nil), its output
// appended to logPath.
func (ps *Processes) Start(name, bin string, args, env []string, logPath string) (*Process, error) {
	return ps.start(name, bin, args, env, logPath, 0)
}

// start is Start with the clone flags of the child: CLONE_NEWNS gives it a mount namespace of its
// own.
func (ps *Processes) start(name, bin string, args, env []string, logPath string, cloneflags uintptr) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := fork.Start(cmd, cloneflags); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, cmd: cmd, LogPath: logPath, exited: make(chan struct{})}
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

// KillAll kills every process still running and waits for each to exit.
func (ps *Processes) KillAll() {
	ps.mu.Lock()
	live := make([]*Process, 0, len(ps.live))
	for p := range ps.live {
		live = append(live, p)
	}
	ps.mu.Unlock()
	for _, p := range live {
		_ = p.Kill()
	}
}

// Pid is the process's ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Running tells whether the process has not exited yet.
func (p *Process) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Signal sends sig to the process; a process that has exited is not signalled.
func (p *Process) Signal(sig syscall.Signal) error {
	if !p.Running() {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: send %v: %w", p.Name, sig, err)
	}
	return nil
}

// Stop asks the process to end with SIGTERM, as the kubelet does when it deletes a pod, and kills
// it after grace. It returns an error when the process had to be killed.
func (p *Process) Stop(grace time.Duration) error {
	if !p.Running() {
		return nil
	}
	// SIGCONT lets a paused process see the SIGTERM.
	if err := errors.Join(p.Signal(syscall.SIGTERM), p.Signal(syscall.SIGCONT)); err != nil {
		return err
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
	}
	if err := p.Kill(); err != nil {
		return err
	}
	return fmt.Errorf("%s did not stop within %s of SIGTERM and was killed", p.Name, grace)
}

// Kill ends the process with SIGKILL, with no chance to clean up, and waits for it to exit.
func (p *Process) Kill() error {
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s did not exit within 30s of SIGKILL", p.Name)
	}
}

// KillGroup ends the process and every process of its group with SIGKILL, as a container runtime
// ends a container, and waits for the process itself to exit. Every child leads a group of its
// own, so the group is the process and what it started without a group of its own.
func (p *Process) KillGroup() error {
	if p.Running() {
		if err := syscall.Kill(-p.Pid(), syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("%s: kill its process group: %w", p.Name, err)
		}
	}
	deadline := time.After(30 * time.Second)
	select {
	case <-p.exited:
	case <-deadline:
		return fmt.Errorf("%s did not exit within 30s of SIGKILL", p.Name)
	}
	// The rest of the group dies too, but not at once: a FUSE mount answers ENOTCONN only once
	// its mounter is gone, so the group is over when none of its processes runs any more.
	for {
		left := groupMembers(p.Pid())
		if len(left) == 0 {
			return nil
		}
		select {
		case <-deadline:
			return fmt.Errorf("%s: processes %v of its group still run 30s after SIGKILL", p.Name, left)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// groupMembers lists the processes of the process group pgid that have not ended (zombies, which
// only wait to be reaped, have).
func groupMembers(pgid int) []int {
	return ProcessesWhere(func(pid int) bool {
		stat, ok := ProcessStat(pid)
		return ok && stat.PGRP == pgid && stat.State != "Z" && stat.State != "X"
	})
}

// ProcessesWhere lists the processes of this machine (its /proc) for which keep returns true. A
// process may end while keep looks at it: keep then finds its /proc files gone.
func ProcessesWhere(keep func(pid int) bool) []int {
	procs, err := procfs.AllProcs()
	if err != nil {
		return nil
	}
	var out []int
	for _, p := range procs {
		if keep(p.PID) {
			out = append(out, p.PID)
		}
	}
	return out
}

// CommandLine returns the arguments of process pid, its program first; none when the process has
// ended, a zombie included (its command line is empty).
func CommandLine(pid int) []string {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return nil
	}
	args, err := p.CmdLine()
	if err != nil || len(args) == 0 {
		return nil
	}
	return args
}

// ProcessStat reads /proc/<pid>/stat: the process's state, parent, group, CPU times; false when
// the process has ended.
func ProcessStat(pid int) (procfs.ProcStat, bool) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return procfs.ProcStat{}, false
	}
	stat, err := p.Stat()
	return stat, err == nil
}

// ProcessFDs counts the open file descriptors of process pid (the entries of /proc/<pid>/fd);
// false when the process has ended.
func ProcessFDs(pid int) (int, bool) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, false
	}
	n, err := p.FileDescriptorsLen()
	return n, err == nil
}

// Pause freezes the process with SIGSTOP: its sockets stay open and accept connections, but
// nothing answers. Stop and Kill end a paused process too.
func (p *Process) Pause() error { return p.Signal(syscall.SIGSTOP) }

// Resume lets a paused process run again (SIGCONT), as if it had never stopped: its timers fire
// late, all at once.
func (p *Process) Resume() error { return p.Signal(syscall.SIGCONT) }

// ExitStatus describes how the process ended, or says that it runs.
func (p *Process) ExitStatus() string {
	if p.Running() {
		return "running"
	}
	return p.cmd.ProcessState.String()
}

// LogTail returns the last n lines of the process's log.
func (p *Process) LogTail(n int) string { return FileTail(p.LogPath, n) }

// LogContains tells whether the process's log holds s.
func (p *Process) LogContains(s string) bool {
	data, err := os.ReadFile(p.LogPath)
	return err == nil && strings.Contains(string(data), s)
}

// FileTail returns the last n lines of the file at path, or what went wrong reading it.
func FileTail(path string, n int) string {
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
