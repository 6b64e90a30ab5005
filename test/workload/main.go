// Command workload stands in for a container that uses a CSI volume. test/kubelet's StartWorkload
// starts it in a new mount namespace (clone with CLONE_NEWNS); it sets that namespace up the way
// runc sets up a container's (a root of its own that holds only the volume), mounts the volume's
// publish path into it with the propagation a pod asks for, then writes and reads a file on the
// volume every interval until it is killed or gets SIGTERM. With -mode hold it opens its data file once and writes, syncs and reads back one
// record at each iteration through that descriptor (as a database or a log writer does), so
// that a mount which breaks under it shows as failed system calls on a descriptor opened before
// the break; with -mode dirfd it holds the folder open and creates, stats and reads a file
// through that descriptor. Run as a container's command instead (no -target), it only writes and
// reads on -dir, where the container runtime mounted the volume, or on each -dir given, one loop
// each, whose lines then carry "dir". With -report changes it prints only each loop's first line
// and those whose outcome differs from the one before, so that a pod of many volumes says little
// more than when each failed and when it came back.
//
// Each iteration writes one JSON line to standard output:
//
//	{"seq":1,"time":"2026-01-02T15:04:05.999999999Z","ok":false,"op":"open","err":"transport endpoint is not connected","took":0.0004}
//
// seq counts iterations from 1; time is when the iteration began; took how long its system
// calls took, in seconds; op names the step that failed (open, openat, write, fsync, close,
// fstatat, read or compare) and err its error, the errno's text for a system
// call. test/kubelet's Result parses these lines. Set-up failures go to standard error, and the
// program exits with status 1.
//
// Nothing it mounts outlives it: its mounts belong to its namespace, which ends with it.
//
// It owns the workload's I/O loop and its report. Of volume-healer it imports only test/mountns
// (the check that it runs in a mount namespace of its own, shared with test/container) and must
// import nothing else: it stands in for a user's container, which knows nothing of the healer. test/harness builds
// it (BuildWorkload), and hack/images --cluster-images builds it into the node's workload image.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-healer/volume-healer/test/mountns"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "workload: %v\n", err)
		os.Exit(1)
	}
}

type config struct {
	target, propagation, name, mode, report string
	// dirs holds each -dir: one in a namespace of its own (-target), one or more in a container.
	dirs []string
	// interval is the time between tries; okInterval the time after a try that succeeded.
	interval, okInterval time.Duration
}

// The values of -report.
const (
	reportEvery   = "every"
	reportChanges = "changes"
)

// dirList collects each -dir given.
type dirList []string

func (d *dirList) String() string { return strings.Join(*d, ",") }

func (d *dirList) Set(v string) error {
	if v == "" {
		return errors.New("empty folder")
	}
	*d = append(*d, v)
	return nil
}

func run() error {
	var c config
	fs := flag.NewFlagSet("workload", flag.ContinueOnError)
	fs.StringVar(&c.target, "target", "", "host `path` to mount into the namespace: the volume's publish path; empty in a container, whose runtime mounted the volume at -dir")
	fs.Var((*dirList)(&c.dirs), "dir", "`folder` to mount it at inside the namespace, or where the container has its volume (required); in a container it may be given once per volume, and each folder gets a loop of its own")
	fs.StringVar(&c.propagation, "propagation", "None", "mount propagation of the pod's volumeMount: HostToContainer, None or Bidirectional")
	fs.DurationVar(&c.interval, "interval", 50*time.Millisecond, "time between iterations")
	fs.DurationVar(&c.okInterval, "ok-interval", 0, "time between iterations while they succeed, if not -interval: a workload that uses its volume less often than it retries a failure")
	fs.StringVar(&c.name, "name", "workload", "the data file is <dir>/<name>.data")
	fs.StringVar(&c.mode, "mode", modeReopen, "how the volume is used: "+modeReopen+" (open, write, fsync, close and read the data file at each iteration), "+modeHold+" (open the data file once and write, fsync and read back one record through that descriptor at each iteration, as a database or a log writer does) or "+modeDirFD+" (open the folder once and create, write, stat and read a file through that descriptor at each iteration)")
	fs.StringVar(&c.report, "report", reportEvery, "which iterations print their line: "+reportEvery+" or "+reportChanges+" (the first, and each whose outcome differs from the previous one's, so that many volumes print little)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if len(c.dirs) == 0 {
		return errors.New("-dir is required")
	}
	if len(c.dirs) > 1 && c.target != "" {
		return fmt.Errorf("-dir given %d times with -target: a namespace of its own holds one volume", len(c.dirs))
	}
	if c.report != reportEvery && c.report != reportChanges {
		return fmt.Errorf("-report %q: want %s or %s", c.report, reportEvery, reportChanges)
	}
	if c.interval <= 0 {
		return fmt.Errorf("-interval %s: must be positive", c.interval)
	}
	switch {
	case c.okInterval == 0:
		c.okInterval = c.interval
	case c.okInterval < 0:
		return fmt.Errorf("-ok-interval %s: must be positive", c.okInterval)
	}
	flags, err := propagationFlags(c.propagation)
	if err != nil {
		return err
	}
	// In a container (no -target) the runtime has set up the namespace and mounted the volumes.
	volumes := c.dirs
	if c.target != "" {
		volume, err := setUpNamespace(c.target, c.dirs[0], flags)
		if err != nil {
			return err
		}
		volumes = []string{volume}
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	out := &output{enc: json.NewEncoder(os.Stdout)}
	// A line names its folder only where there are several.
	named := len(volumes) > 1
	errs := make(chan error, len(volumes))
	for i, volume := range volumes {
		step, closeStep, err := newStep(c.mode, volume, c.name)
		if err != nil {
			stop()
			return err
		}
		defer closeStep()
		dir := ""
		if named {
			dir = c.dirs[i]
		}
		go func() { errs <- loop(ctx, step, c.interval, c.okInterval, out, dir, c.report == reportChanges) }()
	}
	var first error
	for range volumes {
		if err := <-errs; err != nil && first == nil {
			first = err
			stop()
		}
	}
	return first
}

// output writes the loops' lines, one whole line at a time.
type output struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (o *output) write(r report) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.enc.Encode(r)
}

// propagationFlags maps a pod's volumeMount mountPropagation to the flags that set a mount's
// propagation, as kubelet and the container runtime map it: kubelet's translateMountPropagation
// (pkg/kubelet/kubelet_pods.go) turns None into CRI PROPAGATION_PRIVATE, HostToContainer into
// PROPAGATION_HOST_TO_CONTAINER and Bidirectional into PROPAGATION_BIDIRECTIONAL; containerd's
// CRI plugin (WithMounts, internal/cri/opts/spec_linux_opts.go) and CRI-O turn those into the
// "rprivate", "rslave" and "rshared" options of the bind mount, which runc applies as
// MS_REC|MS_PRIVATE, MS_REC|MS_SLAVE and MS_REC|MS_SHARED.
func propagationFlags(mode string) (uintptr, error) {
	switch mode {
	case "None":
		return syscall.MS_REC | syscall.MS_PRIVATE, nil
	case "HostToContainer":
		return syscall.MS_REC | syscall.MS_SLAVE, nil
	case "Bidirectional":
		return syscall.MS_REC | syscall.MS_SHARED, nil
	}
	return 0, fmt.Errorf("-propagation %q: want HostToContainer, None or Bidirectional", mode)
}

// setUpNamespace makes this mount namespace a container's: "/" recursively slave, as runc's
// prepareRoot does when the spec sets no rootfs propagation, so that no mount made here reaches
// the host; then a root of its own, as runc's pivot_root into the container's rootfs, holding
// only target bound with the propagation flags, which it returns the path of.
//
// The root of its own matters: a namespace that kept copies of the host's mounts (the node's
// staging mounts, other pods' publish targets) would hold mounts no container has, and a heal
// that replaces them on the host would find those copies, stale, in this process's namespace,
// as if a pod with propagation None still saw the dead mount. The new root is a tmpfs mounted on
// dir in this namespace alone (on the host dir stays an empty folder); the volume is at /volume.
//
// For a Bidirectional mount containerd also sets the rootfs propagation to rshared, which would
// let this bind appear in the host's namespace and outlive the process; the root stays slave
// here. The volume still receives what the host mounts on target, which is what Bidirectional is
// used for in these tests.
func setUpNamespace(target, dir string, flags uintptr) (string, error) {
	if err := mountns.RequireOwn("test/kubelet's StartWorkload"); err != nil {
		return "", err
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_SLAVE, ""); err != nil {
		return "", fmt.Errorf("make / rslave: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "mode=0755,size=1m"); err != nil {
		return "", fmt.Errorf("mount the new root at %s: %w", dir, err)
	}
	volume, old := filepath.Join(dir, "volume"), filepath.Join(dir, "old-root")
	for _, d := range []string{volume, old} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", err
		}
	}
	if err := syscall.Mount(target, volume, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return "", fmt.Errorf("bind %s at %s: %w", target, volume, err)
	}
	if err := syscall.Mount("", volume, "", flags, ""); err != nil {
		return "", fmt.Errorf("set the propagation of %s: %w", volume, err)
	}
	if err := syscall.PivotRoot(dir, old); err != nil {
		return "", fmt.Errorf("pivot_root to %s: %w", dir, err)
	}
	if err := os.Chdir("/"); err != nil {
		return "", err
	}
	if err := syscall.Unmount("/old-root", syscall.MNT_DETACH); err != nil {
		return "", fmt.Errorf("detach the host's root: %w", err)
	}
	if err := os.Remove("/old-root"); err != nil {
		return "", err
	}
	return "/volume", nil
}

// report is one line of output; test/kubelet's Result reads it.
type report struct {
	Seq  int64     `json:"seq"`
	Time time.Time `json:"time"`
	// Dir is the folder of the volume, where the workload uses several.
	Dir string `json:"dir,omitempty"`
	OK  bool   `json:"ok"`
	Op  string `json:"op,omitempty"`
	Err string `json:"err,omitempty"`
	// Took is how long the iteration's system calls took, in seconds: a write that waits for
	// a mounter to come back shows here as a stall rather than as an error.
	Took float64 `json:"took"`
}

// step is one iteration's I/O: it writes line (the iteration's record) and reads it back,
// and returns the step that failed.
type step func(seq int64, line string) (op string, err error)

// loop runs do every interval (every okInterval after a try that succeeded) until ctx is done
// and prints each iteration's line to out, with dir when not empty; with changesOnly, only the
// first line and those whose outcome (ok, or the failed step and its error) differs from the
// previous iteration's.
func loop(ctx context.Context, do step, interval, okInterval time.Duration, out *output, dir string, changesOnly bool) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	var last *report
	for seq := int64(1); ; seq++ {
		r := report{Seq: seq, Time: time.Now(), Dir: dir}
		op, err := do(seq, Record(seq, r.Time))
		r.Took = time.Since(r.Time).Seconds()
		if err != nil {
			r.Op, r.Err = op, errText(err)
		} else {
			r.OK = true
		}
		if !changesOnly || last == nil || last.OK != r.OK || last.Op != r.Op || last.Err != r.Err {
			// One Write per line; an error means whoever reads the lines is gone.
			if err := out.write(r); err != nil {
				return err
			}
		}
		last = &r
		// The next try is due one interval after this one began.
		next := interval
		if r.OK {
			next = okInterval
		}
		timer.Reset(max(0, time.Until(r.Time.Add(next))))
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
	}
}

// The modes of -mode.
const (
	modeReopen = "reopen"
	modeHold   = "hold"
	modeDirFD  = "dirfd"
)

// RecordSize is the length of each record of the data file in mode hold: record seq sits at
// offset (seq-1)*RecordSize, so that whoever reads the file afterwards finds every record a
// try reported written where it belongs.
const RecordSize = 64

// Record is iteration seq's record, begun at t: RecordSize bytes ending in a newline.
func Record(seq int64, t time.Time) string {
	return fmt.Sprintf("%-*s\n", RecordSize-1, fmt.Sprintf("%d %s", seq, t.Format(time.RFC3339Nano)))
}

// newStep opens what mode keeps open for the whole run and returns the iteration it does, and
// what closes it. The data file of mode hold is created empty: its records are this run's.
func newStep(mode, dir, name string) (step, func(), error) {
	file := filepath.Join(dir, name+".data")
	switch mode {
	case modeReopen:
		return func(_ int64, line string) (string, error) { return writeAndCheck(file, line) }, func() {}, nil
	case modeHold:
		f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return nil, nil, fmt.Errorf("open %s to hold it: %w", file, err)
		}
		return func(seq int64, line string) (string, error) { return writeAt(f, seq, line) }, func() { _ = f.Close() }, nil
	case modeDirFD:
		d, err := os.Open(dir)
		if err != nil {
			return nil, nil, fmt.Errorf("open the folder %s to hold it: %w", dir, err)
		}
		fd := int(d.Fd())
		return func(_ int64, line string) (string, error) { return writeThroughDir(fd, name+".entry", line) }, func() { _ = d.Close() }, nil
	}
	return nil, nil, fmt.Errorf("-mode %q: want %s, %s or %s", mode, modeReopen, modeHold, modeDirFD)
}

// writeAt writes line as record seq through the descriptor held since the start, syncs it and
// reads it back through the same descriptor.
func writeAt(f *os.File, seq int64, line string) (string, error) {
	off := (seq - 1) * RecordSize
	if _, err := f.WriteAt([]byte(line), off); err != nil {
		return "write", err
	}
	if err := f.Sync(); err != nil {
		return "fsync", err
	}
	got := make([]byte, len(line))
	if _, err := f.ReadAt(got, off); err != nil {
		return "read", err
	}
	if string(got) != line {
		return "compare", fmt.Errorf("read back %q, wrote %q", got, line)
	}
	return "", nil
}

// writeThroughDir creates name in the folder held open as dir (openat), writes line, syncs and
// closes it, looks it up again (fstatat) and reads it back: every path lookup goes through the
// held folder's descriptor.
func writeThroughDir(dir int, name, line string) (string, error) {
	fd, err := unix.Openat(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return "openat", err
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.WriteString(line); err != nil {
		_ = f.Close()
		return "write", err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return "fsync", err
	}
	if err := f.Close(); err != nil {
		return "close", err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, 0); err != nil {
		return "fstatat", err
	}
	if st.Size != int64(len(line)) {
		return "compare", fmt.Errorf("fstatat says %d bytes, wrote %d", st.Size, len(line))
	}
	fd, err = unix.Openat(dir, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "openat", err
	}
	f = os.NewFile(uintptr(fd), name)
	got, err := io.ReadAll(f)
	_ = f.Close()
	if err != nil {
		return "read", err
	}
	if string(got) != line {
		return "compare", fmt.Errorf("read back %q, wrote %q", got, line)
	}
	return "", nil
}

// writeAndCheck replaces the contents of file with line, syncs it to the volume, and reads it
// back. It returns the step that failed.
func writeAndCheck(file, line string) (string, error) {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return "open", err
	}
	if _, err := f.WriteString(line); err != nil {
		_ = f.Close()
		return "write", err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return "fsync", err
	}
	if err := f.Close(); err != nil {
		return "close", err
	}
	got, err := os.ReadFile(file)
	if err != nil {
		return "read", err
	}
	if string(got) != line {
		return "compare", fmt.Errorf("read back %q, wrote %q", got, line)
	}
	return "", nil
}

// errText is the errno's text for a failed system call ("transport endpoint is not connected"),
// else the error.
func errText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}
