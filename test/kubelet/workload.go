package kubelet

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/volume-healer/volume-healer/test/harness/fork"
)

// WorkloadOptions say how to run a workload.
type WorkloadOptions struct {
	// Bin is the path of the built test/workload program. Required.
	Bin string
	// Target is the host path the workload mounts, usually a PublishPath. Required.
	Target string
	// Propagation is the mountPropagation of the pod's volumeMount. Default: None, as in
	// Kubernetes, with which the workload never sees a mount that a heal stacks on Target.
	Propagation corev1.MountPropagationMode
	// Dir is the folder the workload mounts its own root at (a tmpfs holding only the volume,
	// which it then pivots into, as runc does into a container's rootfs), inside its own mount
	// namespace: on the host it stays an empty folder. Default: a new temporary folder, removed by
	// Stop.
	Dir string
	// Interval is the time between two iterations. Default: 50ms.
	Interval time.Duration
	// Name names the workload in messages and its data file <Name>.data on the volume. Default:
	// "workload".
	Name string
	// Log receives the workload's output, its JSON lines and any error, as they come. Default:
	// none.
	Log io.Writer
}

func (o *WorkloadOptions) setDefaults() error {
	if o.Bin == "" || o.Target == "" {
		return errors.New("workload: both Bin and Target are required")
	}
	switch o.Propagation {
	case "":
		o.Propagation = corev1.MountPropagationNone
	case corev1.MountPropagationNone, corev1.MountPropagationHostToContainer, corev1.MountPropagationBidirectional:
	default:
		return fmt.Errorf("workload: propagation %q: want HostToContainer, None or Bidirectional", o.Propagation)
	}
	if o.Interval <= 0 {
		o.Interval = 50 * time.Millisecond
	}
	if o.Name == "" {
		o.Name = "workload"
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return nil
}

// Result is one iteration of a workload: it replaced the contents of its data file, synced it and
// read it back. It is one JSON line of test/workload's output.
type Result struct {
	// Seq counts iterations from 1.
	Seq int64 `json:"seq"`
	// Time is when the iteration began, by the workload's clock.
	Time time.Time `json:"time"`
	// OK says whether every step succeeded.
	OK bool `json:"ok"`
	// Op is the step that failed: open, write, fsync, close, read or compare.
	Op string `json:"op,omitempty"`
	// Err is why it failed: for a system call the errno's text, such as "transport endpoint is
	// not connected".
	Err string `json:"err,omitempty"`
}

func (r Result) String() string {
	if r.OK {
		return fmt.Sprintf("#%d at %s: ok", r.Seq, r.Time.Format(time.RFC3339Nano))
	}
	return fmt.Sprintf("#%d at %s: %s: %s", r.Seq, r.Time.Format(time.RFC3339Nano), r.Op, r.Err)
}

// Outage is a run of failed iterations.
type Outage struct {
	// FirstFailure is the iteration that began the outage.
	FirstFailure Result
	// Recovery is the first good iteration after FirstFailure; its Seq is 0 while the outage
	// lasts.
	Recovery Result
	// Failures counts the failed iterations from FirstFailure up to Recovery.
	Failures int
}

// Over says whether the workload has had a good iteration since the outage began.
func (o Outage) Over() bool { return o.Recovery.Seq != 0 }

// Duration is the time from the start of the first failed iteration to the start of the first
// good one after it, or 0 while the outage lasts.
func (o Outage) Duration() time.Duration {
	if !o.Over() {
		return 0
	}
	return o.Recovery.Time.Sub(o.FirstFailure.Time)
}

// Workload is a running test/workload process.
type Workload struct {
	name, dir, file string
	tempDir         bool
	cmd             *exec.Cmd
	// done is closed once the process has exited, its output is read and it is waited for.
	done chan struct{}

	mu      sync.Mutex
	results []Result
	// changed is closed, and replaced, whenever results grows or the process exits.
	changed  chan struct{}
	stopping bool
	exited   bool
	exitErr  error
	stderr   bytes.Buffer

	stopOnce sync.Once
	stopErr  error
}

// StartWorkload starts test/workload in a new mount namespace, as a container runtime starts a
// container, and returns once it has made its first iteration, good or not, so that its mounts
// are in place. It dies with this process. Stop ends it.
func StartWorkload(ctx context.Context, o WorkloadOptions) (*Workload, error) {
	if err := o.setDefaults(); err != nil {
		return nil, err
	}
	w := &Workload{name: o.Name, dir: o.Dir, file: o.Name + ".data", done: make(chan struct{}), changed: make(chan struct{})}
	if w.dir == "" {
		dir, err := os.MkdirTemp("", "workload-"+o.Name+"-")
		if err != nil {
			return nil, err
		}
		w.dir, w.tempDir = dir, true
	}
	log := &lockedWriter{w: o.Log}
	w.cmd = exec.Command(o.Bin,
		"-target", o.Target, "-dir", w.dir, "-propagation", string(o.Propagation),
		"-interval", o.Interval.String(), "-name", o.Name)
	w.cmd.Stderr = io.MultiWriter(log, stderrWriter{w})
	stdout, err := w.cmd.StdoutPipe()
	if err != nil {
		w.removeDir()
		return nil, err
	}
	// It dies with this process, in a mount namespace of its own; Stop ends it.
	if err := fork.Start(w.cmd, syscall.CLONE_NEWNS); err != nil {
		w.removeDir()
		return nil, fmt.Errorf("start workload %s: %w", o.Name, err)
	}
	go w.read(stdout, log)

	if _, err := w.waitFor(ctx, "its first iteration", func(Result) bool { return true }); err != nil {
		_ = w.Stop()
		return nil, err
	}
	return w, nil
}

// read records every line of the workload's output until it exits, then waits for it.
func (w *Workload) read(stdout io.Reader, log io.Writer) {
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Bytes()
		// One Write per line, so that standard error does not cut into it; the copy leaves the
		// scanner's buffer alone.
		_, _ = log.Write(append(bytes.Clone(line), '\n'))
		var r Result
		if err := json.Unmarshal(line, &r); err != nil {
			_, _ = stderrWriter{w}.Write([]byte(fmt.Sprintf("unreadable output line %q: %v\n", line, err)))
			continue
		}
		w.mu.Lock()
		w.results = append(w.results, r)
		w.notifyLocked()
		w.mu.Unlock()
	}
	// Only a line too long stops the scanner early; the rest must still be read for the process
	// to end.
	_, _ = io.Copy(io.Discard, stdout)
	err := w.cmd.Wait()

	w.mu.Lock()
	w.exited = true
	if !w.stopping {
		w.exitErr = err
		if err == nil {
			w.exitErr = errors.New("exited with status 0")
		}
	}
	w.notifyLocked()
	w.mu.Unlock()
	close(w.done)
}

func (w *Workload) notifyLocked() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// Pid returns the workload's process ID.
func (w *Workload) Pid() int { return w.cmd.Process.Pid }

// Name returns the workload's name.
func (w *Workload) Name() string { return w.name }

// Dir returns the folder the volume is mounted at inside the workload's mount namespace, under
// the root of its own that test/workload sets up; from outside, /proc/<Pid>/root/<Dir> shows what
// the workload sees there.
func (w *Workload) Dir() string { return workloadVolumeDir }

// workloadVolumeDir is where test/workload mounts the volume in its own root.
const workloadVolumeDir = "/volume"

// DataFile returns the path of the file the workload writes, relative to the root of the volume.
func (w *Workload) DataFile() string { return w.file }

// Done is closed once the workload has exited and been waited for.
func (w *Workload) Done() <-chan struct{} { return w.done }

// Results returns every iteration so far, oldest first.
func (w *Workload) Results() []Result {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Result(nil), w.results...)
}

// FailuresSince returns the failed iterations that began at or after t.
func (w *Workload) FailuresSince(t time.Time) []Result {
	var failed []Result
	for _, r := range w.Results() {
		if !r.OK && !r.Time.Before(t) {
			failed = append(failed, r)
		}
	}
	return failed
}

// Outage returns the first outage that began at or after since: its first failed iteration, the
// first good one after that, and how many failed in between. It returns false if no iteration
// since then failed.
func (w *Workload) Outage(since time.Time) (Outage, bool) {
	var o Outage
	for _, r := range w.Results() {
		if r.Time.Before(since) {
			continue
		}
		switch {
		case !r.OK && o.Failures == 0:
			o.FirstFailure, o.Failures = r, 1
		case !r.OK:
			o.Failures++
		case o.Failures > 0:
			o.Recovery = r
			return o, true
		}
	}
	return o, o.Failures > 0
}

// WaitOK waits for the first good iteration that began after the time after, and returns it.
// It fails when ctx ends or the workload exits first.
func (w *Workload) WaitOK(ctx context.Context, after time.Time) (Result, error) {
	return w.waitFor(ctx, "a good iteration after "+after.Format(time.RFC3339Nano), func(r Result) bool {
		return r.OK && r.Time.After(after)
	})
}

// WaitFailure waits for the first failed iteration that began after the time after, and
// returns it. It fails when ctx ends or the workload exits first.
func (w *Workload) WaitFailure(ctx context.Context, after time.Time) (Result, error) {
	return w.waitFor(ctx, "a failed iteration after "+after.Format(time.RFC3339Nano), func(r Result) bool {
		return !r.OK && r.Time.After(after)
	})
}

func (w *Workload) waitFor(ctx context.Context, what string, match func(Result) bool) (Result, error) {
	seen := 0
	for {
		w.mu.Lock()
		for ; seen < len(w.results); seen++ {
			if r := w.results[seen]; match(r) {
				w.mu.Unlock()
				return r, nil
			}
		}
		changed, exited := w.changed, w.exited
		w.mu.Unlock()
		if exited {
			return Result{}, fmt.Errorf("workload %s ended before %s: %w", w.name, what, w.exitError())
		}
		select {
		case <-changed:
		case <-ctx.Done():
			last := "none"
			if rs := w.Results(); len(rs) > 0 {
				last = rs[len(rs)-1].String()
			}
			return Result{}, fmt.Errorf("workload %s: no %s (last iteration: %s): %w", w.name, what, last, ctx.Err())
		}
	}
}

// exitError describes how the process ended, with what it wrote to standard error.
func (w *Workload) exitError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	err := w.exitErr
	if err == nil {
		err = errors.New("stopped")
	}
	if msg := strings.TrimSpace(w.stderr.String()); msg != "" {
		return fmt.Errorf("%w: %s", err, msg)
	}
	return err
}

// Stop kills the workload and waits for it; its mount namespace, and every mount in it, ends
// with it. It returns an error if the workload had already exited of its own accord. Stop may be
// called more than once.
func (w *Workload) Stop() error {
	w.stopOnce.Do(func() {
		w.mu.Lock()
		early := w.exited
		w.stopping = true
		w.mu.Unlock()
		// The process may have exited already; then Kill fails and done is closed.
		_ = w.cmd.Process.Kill()
		<-w.done
		if early {
			w.stopErr = fmt.Errorf("workload %s: %w", w.name, w.exitError())
		}
		if err := w.removeDir(); err != nil && w.stopErr == nil {
			w.stopErr = err
		}
	})
	return w.stopErr
}

// removeDir removes Dir if StartWorkload made it. Only the empty folder is removed: on the host
// the volume was never mounted there.
func (w *Workload) removeDir() error {
	if !w.tempDir {
		return nil
	}
	if err := os.Remove(w.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("workload %s: %w", w.name, err)
	}
	return nil
}

// stderrWriter keeps what the workload writes to standard error for error messages.
type stderrWriter struct{ w *Workload }

func (s stderrWriter) Write(p []byte) (int, error) {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	return s.w.stderr.Write(p)
}

// lockedWriter lets the output and the error stream of a workload share one Log.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
