package driverkit_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/volume-healer/volume-healer/driverkit"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// helperStartTimeout bounds how long a helper process may take to say it is ready.
const helperStartTimeout = 20 * time.Second

// requireMounts skips the test when it cannot mount (not root; no /dev/fuse when fuse is set),
// and fails it instead when CI=true, where a missing privilege means the CI job is wrong.
func requireMounts(t *testing.T, fuse bool) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	if fuse {
		if _, err := os.Stat("/dev/fuse"); err != nil {
			missing = append(missing, "/dev/fuse")
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("this test mounts filesystems and needs %s", strings.Join(missing, " and "))
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI=true, so a missing privilege is a failure)", msg)
	}
	t.Skip(msg)
}

// mkdir makes a folder under root and returns its path.
func mkdir(t *testing.T, root string, elem ...string) string {
	t.Helper()
	dir := filepath.Join(append([]string{root}, elem...)...)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// cleanupMounts removes every mount at dir when the test ends, before t.TempDir's folders are
// removed (cleanups run last-registered first).
func cleanupMounts(t *testing.T, dir string) {
	t.Cleanup(func() {
		if _, err := driverkit.UnmountAll(dir); err != nil {
			t.Errorf("clean up the mounts at %s: %v", dir, err)
		}
	})
}

// mountTmpfs mounts a small tmpfs at dir, with extra mount flags.
func mountTmpfs(t *testing.T, dir string, flags uintptr) {
	t.Helper()
	if err := unix.Mount(testSource, dir, "tmpfs", flags, "size=8m"); err != nil {
		t.Fatalf("mount tmpfs at %s: %v", dir, err)
	}
	cleanupMounts(t, dir)
}

// sharedRoot returns a folder whose mounts propagate to the mount namespaces that are its
// slaves, like kubelet's root on a node: a tmpfs marked shared.
func sharedRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	mountTmpfs(t, root, 0)
	if err := unix.Mount("", root, "", unix.MS_SHARED, ""); err != nil {
		t.Fatalf("make %s shared: %v", root, err)
	}
	return root
}

// topMount returns the top-most mount at path in this process's mount table.
func topMount(t *testing.T, path string) *mountinfo.Info {
	t.Helper()
	infos, err := mountinfo.GetMounts(at(path))
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) == 0 {
		return nil
	}
	return infos[len(infos)-1]
}

// mountCount returns how many mounts are stacked at path.
func mountCount(t *testing.T, path string) int {
	t.Helper()
	infos, err := mountinfo.GetMounts(at(path))
	if err != nil {
		t.Fatal(err)
	}
	return len(infos)
}

// at keeps the mounts at path, stacked ones too, in mount order.
func at(path string) mountinfo.FilterFunc {
	return func(m *mountinfo.Info) (skip, stop bool) { return m.Mountpoint != path, false }
}

// mountOptions are a mount's own options: "rw", "nosuid", ...
func mountOptions(m *mountinfo.Info) []string { return strings.Split(m.Options, ",") }

// helper is a child process running this test binary in one of its helper modes.
type helper struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
	exited chan struct{}

	mu   sync.Mutex
	last string // the last line it printed
}

// startHelper starts the test binary in mode with env and waits until it prints readyLine.
func startHelper(mode string, env []string, attr *syscall.SysProcAttr) (*helper, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	h := &helper{exited: make(chan struct{})}
	h.cmd = exec.Command(exe)
	h.cmd.Env = append(append(os.Environ(), helperEnv+"="+mode, sourceEnv+"="+testSource), env...)
	h.cmd.SysProcAttr = attr
	h.cmd.Stderr = &lockedWriter{w: &h.stderr, mu: &h.mu}
	out, err := h.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := h.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s helper: %w", mode, err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		first := true
		for sc.Scan() {
			h.mu.Lock()
			h.last = sc.Text()
			h.mu.Unlock()
			if first && sc.Text() == readyLine {
				first = false
				close(ready)
			}
		}
		// Every read is done: Wait may close the pipe now.
		_ = h.cmd.Wait()
		close(h.exited)
	}()
	select {
	case <-ready:
		return h, nil
	case <-h.exited:
		return nil, fmt.Errorf("%s helper exited before it was ready: %s", mode, h.errors())
	case <-time.After(helperStartTimeout):
		h.kill()
		return nil, fmt.Errorf("%s helper was not ready within %s: %s", mode, helperStartTimeout, h.errors())
	}
}

func (h *helper) errors() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.TrimSpace(h.stderr.String())
}

// lastLine returns the last line the helper printed.
func (h *helper) lastLine() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// signal sends sig to the helper.
func (h *helper) signal(sig syscall.Signal) error {
	return h.cmd.Process.Signal(sig)
}

// waitStopped waits until every thread of the helper is stopped.
func (h *helper) waitStopped() error {
	pid := h.cmd.Process.Pid
	return poll.Until(context.Background(), 10*time.Second, fmt.Sprintf("every thread of process %d to stop", pid), func() (bool, string) {
		threads, err := procfs.AllThreads(pid)
		if err != nil || len(threads) == 0 {
			return false, fmt.Sprintf("no threads: %v", err)
		}
		for _, th := range threads {
			if st, err := th.Stat(); err != nil || st.State != "T" {
				return false, fmt.Sprintf("thread %d in state %q (%v)", th.PID, st.State, err)
			}
		}
		return true, ""
	})
}

// kill kills the helper and waits until it is gone; a stopped helper dies too.
func (h *helper) kill() {
	select {
	case <-h.exited:
		return
	default:
	}
	_ = h.cmd.Process.Signal(syscall.SIGKILL)
	<-h.exited
}

// gone reports whether the helper process has exited.
func (h *helper) gone() bool {
	select {
	case <-h.exited:
		return true
	default:
		return false
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// fuseVolume is a FUSE filesystem served by a daemon in its own process, so that the daemon can
// be killed (a dead mount: ENOTCONN) or stopped (a hung mount) like a real userspace mounter.
type fuseVolume struct {
	t      *testing.T
	mnt    string
	source string

	mu     sync.Mutex
	daemon *helper
}

// newFUSEVolume creates a folder with dataFile in it and serves it at mnt.
func newFUSEVolume(t *testing.T, mnt string) *fuseVolume {
	t.Helper()
	v := &fuseVolume{t: t, mnt: mnt, source: t.TempDir()}
	if err := os.WriteFile(filepath.Join(v.source, dataFile), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	cleanupMounts(t, mnt)
	t.Cleanup(v.killDaemon)
	if err := v.start(); err != nil {
		t.Fatal(err)
	}
	return v
}

// start starts a new daemon at the mount point, on top of whatever is there.
func (v *fuseVolume) start() error {
	d, err := startHelper(helperFUSE, []string{fuseMountEnv + "=" + v.mnt, fuseSourceEnv + "=" + v.source}, nil)
	if err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.daemon = d
	return nil
}

// killDaemon kills the current daemon, leaving its mount dead.
func (v *fuseVolume) killDaemon() {
	v.mu.Lock()
	d := v.daemon
	v.mu.Unlock()
	if d != nil {
		d.kill()
	}
}

// signal sends sig to the current daemon.
func (v *fuseVolume) signal(sig syscall.Signal) error {
	v.mu.Lock()
	d := v.daemon
	v.mu.Unlock()
	if d.gone() {
		return fmt.Errorf("the FUSE daemon of %s has exited", v.mnt)
	}
	if err := d.signal(sig); err != nil {
		return err
	}
	if sig == syscall.SIGSTOP {
		// kill(2) returns before every thread has stopped, and a thread still running could
		// answer one more request.
		return d.waitStopped()
	}
	return nil
}

// signalDaemon sends sig to the current daemon and fails the test if it cannot.
func (v *fuseVolume) signalDaemon(sig syscall.Signal) {
	v.t.Helper()
	if err := v.signal(sig); err != nil {
		v.t.Fatalf("send %s to the FUSE daemon: %v", sig, err)
	}
}

// remount is a Driver's Remount: kill what is left of the daemon and start a new one.
func (v *fuseVolume) remount() error {
	v.killDaemon()
	return v.start()
}

// workload is a process in its own mount namespace that uses a volume's publish target.
type workload struct {
	*helper
}

// startWorkload starts a workload that binds target at a folder of its own, with slave
// propagation (HostToContainer) or, with private set, none.
func startWorkload(t *testing.T, target string, private bool) *workload {
	t.Helper()
	env := []string{workloadTargetEnv + "=" + target, workloadDirEnv + "=" + mkdir(t, t.TempDir(), "volume")}
	if private {
		env = append(env, workloadPrivateEnv+"=1")
	}
	h, err := startHelper(helperWorkload, env, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.kill)
	return &workload{h}
}

// waitReads waits until the workload's reads succeed (ok) or fail, and reports the last line
// it printed when they do not within timeout.
func (w *workload) waitReads(ok bool, timeout time.Duration) (string, bool) {
	deadline := time.Now().Add(timeout)
	for {
		line := w.lastLine()
		if (line == "ok") == ok && line != readyLine && line != "" {
			return line, true
		}
		if time.Now().After(deadline) || w.gone() {
			return line, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// statfsErr returns the error of a statfs of path, with a bound, so that a test does not hang
// on a frozen mount.
func statfsErr(path string) error {
	done := make(chan error, 1)
	go func() {
		var st unix.Statfs_t
		done <- unix.Statfs(path, &st)
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		return errors.New("statfs did not return within 10s")
	}
}
