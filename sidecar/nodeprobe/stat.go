package nodeprobe

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-healer/volume-healer/driverkit"
)

// StatArg is the first argument that makes a program the stat child: a program that runs a
// Prober must start with
//
//	if len(os.Args) > 1 && os.Args[1] == nodeprobe.StatArg {
//		os.Exit(nodeprobe.StatMain(os.Args[2:], os.Stdout))
//	}
//
// so that the Prober can start it as its own child (StatterOptions.Command).
const StatArg = "__volume-healer-stat-mount"

// blockArg, before the path, makes the stat child read a block device instead of stat'ing a
// mount (readBlockDevice).
const blockArg = "--block-device"

// StatMain is the stat child's body: it writes the line "ready" to out, stats the one path in
// args with driverkit.StatMount (or, after "--block-device", reads the block device there:
// readBlockDevice) and writes to out "0" when the calls succeed, else the errno of the call that
// failed and its name ("107 statfs"). It returns the process's exit code: 0 once it has written
// its answer.
func StatMain(args []string, out io.Writer) int {
	check := driverkit.StatMount
	if len(args) == 2 && args[0] == blockArg {
		check, args = readBlockDevice, args[1:]
	}
	if len(args) != 1 {
		fmt.Fprintf(os.Stderr, "%s takes one path, or %s and one path, got %q\n", StatArg, blockArg, args)
		return 2
	}
	// The parent's timer starts at this line, so that a slow start of this process (a loaded
	// node) is not taken for a frozen mount.
	_, _ = fmt.Fprintln(out, statReady)
	err := check(args[0])
	if err == nil {
		_, _ = fmt.Fprintln(out, 0)
		return 0
	}
	var errno syscall.Errno
	var pe *os.PathError
	if !errors.As(err, &errno) || !errors.As(err, &pe) {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	_, _ = fmt.Fprintln(out, int(errno), pe.Op)
	return 0
}

// blockReadSize is how much readBlockDevice reads: one page, the unit of direct I/O.
const blockReadSize = 4096

// readBlockDevice checks that path is a block device and reads its first blockReadSize bytes,
// past the page cache where the device allows (O_DIRECT), so that the answer is the device's
// now and not what was cached before its backend died. A path that is not a block device fails
// with ENOTBLK, a device that reads nothing (size 0) with ENXIO.
func readBlockDevice(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.Mode()&os.ModeDevice == 0 || st.Mode()&os.ModeCharDevice != 0 {
		return &os.PathError{Op: "stat", Path: path, Err: unix.ENOTBLK}
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_DIRECT, 0)
	if errors.Is(err, unix.EINVAL) {
		// A device that does not do direct I/O is read through the cache.
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	// Direct I/O needs an aligned buffer: a mapped page is one.
	buf, err := unix.Mmap(-1, 0, blockReadSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	defer func() { _ = unix.Munmap(buf) }()
	n, err := unix.Pread(fd, buf, 0)
	if err != nil {
		return &os.PathError{Op: "read", Path: path, Err: err}
	}
	if n == 0 {
		// A device of no size has no backend: a loop device whose file was detached, or a
		// network block device whose connection was torn down.
		return &os.PathError{Op: "read", Path: path, Err: unix.ENXIO}
	}
	return nil
}

// StatterOptions configure a Statter. Zero values take the defaults documented on each field.
type StatterOptions struct {
	// Command is the program, and its first arguments, that runs StatMain with the path as its
	// last argument. Default: this program, /proc/self/exe StatArg.
	Command []string
	// Timeout bounds each stat, from the moment the child is ready to make it (StartTimeout
	// bounds its start): the child is killed when it has not answered by then, and the path is
	// reported hung. Default: 5s.
	Timeout time.Duration
	// MaxInFlight bounds the stat children alive at once, killed ones not yet reaped included.
	// A check beyond it fails with ErrStatBusy. Default: 16.
	MaxInFlight int
}

// Statter stats paths, each in a child process of its own that is killed at the deadline. A
// stat of a frozen FUSE mount sleeps in the kernel and no goroutine can be cancelled out of it;
// a process can: the kernel's FUSE client waits for the daemon's answer killably, so SIGKILL ends
// the child, and the only goroutine it ever used (its Wait) returns with it. A frozen mount thus
// costs one process for Timeout at most, whatever the number of probes.
type Statter struct {
	opts     StatterOptions
	inFlight chan struct{}
	// started counts the children ever started, for tests.
	started atomic.Int64
}

// NewStatter returns a Statter with opts' defaults filled in.
func NewStatter(opts StatterOptions) *Statter {
	if len(opts.Command) == 0 {
		opts.Command = []string{"/proc/self/exe", StatArg}
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = 16
	}
	return &Statter{opts: opts, inFlight: make(chan struct{}, opts.MaxInFlight)}
}

// statReady is the child's first line, written just before its stat.
const statReady = "ready"

// StartTimeout bounds the start of a stat child, until it writes that it is about to stat: a
// child that is not ready by then is killed and the stat fails (not hung: the mount was not
// reached). The stat's own Timeout counts from the child's readiness.
const StartTimeout = 10 * time.Second

// reapGrace is how long Stat waits for a killed child to be gone. SIGKILL ends a child waiting
// on a FUSE daemon at once; one still there after this is left to its reaper goroutine, and
// keeps its place in MaxInFlight until it is gone.
const reapGrace = 2 * time.Second

// Stat stats path in a child process and returns the finding of what it answered (nil: the
// path answers), a MountHung finding when it did not answer within the timeout (or ctx's
// deadline, if earlier), or an error when no child could do the stat.
func (s *Statter) Stat(ctx context.Context, path string) (*driverkit.Finding, error) {
	return s.check(ctx, path, "a stat of", "its mounter is frozen or unreachable")
}

// ReadBlock reads the block device at path in a child process, as Stat stats a mount: the
// finding of what it answered (nil: the device is a block device and its first page reads), a
// MountHung finding when the read did not return within the timeout, or an error when no child
// could do it. A read of a device whose backend is gone may wait in the kernel beyond a
// SIGKILL: the child then keeps its place in MaxInFlight until the kernel gives up.
func (s *Statter) ReadBlock(ctx context.Context, path string) (*driverkit.Finding, error) {
	return s.check(ctx, path, "a read of the block device", "its backend is frozen or unreachable", blockArg)
}

// check runs a stat child on path, with args before the path, and reads its answer; what and
// hung describe the check and a check that did not return, for the MountHung finding.
func (s *Statter) check(ctx context.Context, path, what, hung string, args ...string) (*driverkit.Finding, error) {
	select {
	case s.inFlight <- struct{}{}:
	default:
		return nil, fmt.Errorf("%w: %d stats are running; %s was not stat'ed", ErrStatBusy, cap(s.inFlight), path)
	}
	argv := append(s.opts.Command[1:len(s.opts.Command):len(s.opts.Command)], args...)
	cmd := exec.Command(s.opts.Command[0], append(argv, path)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		<-s.inFlight
		return nil, fmt.Errorf("start the stat of %s (%s): %w", path, s.opts.Command[0], err)
	}
	// The child must not outlive the sidecar: a sidecar killed while a child waits on a frozen
	// mount takes the child with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		<-s.inFlight
		return nil, fmt.Errorf("start the stat of %s (%s): %w", path, s.opts.Command[0], err)
	}
	s.started.Add(1)
	// The one goroutine of a child: it reads the child's output to its end (the child's exit or
	// kill closes it), then reaps it.
	ready := make(chan struct{})
	exited := make(chan childExit, 1)
	go func() {
		r := bufio.NewReader(stdout)
		var out strings.Builder
		if line, err := r.ReadString('\n'); err == nil && strings.TrimSpace(line) == statReady {
			close(ready)
		} else {
			out.WriteString(line)
		}
		rest, _ := io.ReadAll(r)
		out.Write(rest)
		err := cmd.Wait()
		<-s.inFlight
		exited <- childExit{out: out.String(), err: err}
	}()
	kill := func() {
		_ = cmd.Process.Kill()
		select {
		case <-exited:
		case <-time.After(reapGrace):
		}
	}

	start := time.NewTimer(StartTimeout)
	defer start.Stop()
	select {
	case <-ready:
	case e := <-exited:
		return answer(path, e)
	case <-start.C:
		kill()
		return nil, fmt.Errorf("the stat of %s did not start within %s (%s)", path, StartTimeout, s.opts.Command[0])
	case <-ctx.Done():
		kill()
		return nil, fmt.Errorf("the stat of %s was cut off before it started: %w", path, context.Cause(ctx))
	}

	timeout := s.opts.Timeout
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = time.Until(d)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case e := <-exited:
		return answer(path, e)
	case <-timer.C:
	case <-ctx.Done():
	}
	kill()
	if err := ctx.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("the stat of %s was cut off: %w", path, context.Cause(ctx))
	}
	return &driverkit.Finding{Path: path, Status: hungStatus, Reason: driverkit.ReasonMountHung,
		Message: fmt.Sprintf("%s %s did not return within %s: %s", what, path, timeout.Round(time.Millisecond), hung)}, nil
}

// childExit is what a stat child wrote after its readiness line, and how it ended.
type childExit struct {
	out string
	err error
}

// answer reads the answer of a child that exited on its own.
func answer(path string, e childExit) (*driverkit.Finding, error) {
	if e.err != nil {
		return nil, fmt.Errorf("the stat of %s failed: %w", path, e.err)
	}
	return parseStat(path, e.out)
}

// parseStat reads the child's answer.
func parseStat(path, out string) (*driverkit.Finding, error) {
	fields := strings.Fields(out)
	if len(fields) == 0 {
		return nil, fmt.Errorf("the stat of %s answered nothing", path)
	}
	n, err := strconv.Atoi(fields[0])
	if err != nil || n < 0 || (n > 0 && len(fields) != 2) {
		return nil, fmt.Errorf("the stat of %s answered %q", path, out)
	}
	if n == 0 {
		return nil, nil
	}
	return driverkit.StatFinding(path, &os.PathError{Op: fields[1], Path: path, Err: unix.Errno(n)}), nil
}
