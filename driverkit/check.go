package driverkit

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"
)

// Expect is what a healthy mount at a path looks like. Zero fields are not checked.
type Expect struct {
	// Source is the mount source the path must show in /proc/self/mountinfo (field 10), e.g. the
	// FsName a FUSE mounter passes. "" accepts any source.
	Source string
	// FSType is the filesystem type the mount must have, e.g. "fuse.refdriver". "" accepts any.
	FSType string
	// ReadOnly says the mount is meant to be read-only; otherwise a read-only mount is reported
	// as ReasonReadOnlyMount.
	ReadOnly bool
}

// CheckerOptions configure a Checker. Zero values take the defaults documented on each field.
type CheckerOptions struct {
	// StatTimeout bounds the stat that finds hung mounts. Default: 5s.
	StatTimeout time.Duration
	// MountInfo is the mount table read to find what is mounted where.
	// Default: /proc/self/mountinfo.
	MountInfo string
	// Proc is the proc filesystem scanned for mount namespaces that still see a dead mount.
	// Default: /proc.
	Proc string
}

// Checker checks mounts. It is safe for concurrent use. A stat that hangs on a mount whose
// mounter does not answer keeps one goroutine blocked; a Checker never starts a second stat of a
// path while one is still running (a check made meanwhile waits for that stat's answer, and once
// the stat is past its deadline reports the path hung at once), so a hung mount never costs more
// than one goroutine however often it is probed.
type Checker struct {
	opts CheckerOptions

	mu sync.Mutex
	// stats holds the stats in flight, keyed by what they wait on: the device of the mount at
	// the path (every path of a frozen mount hangs alike), or the path when nothing is mounted.
	// A stat removes itself when it returns.
	stats map[string]*statCall
	// statsStarted counts the stat goroutines ever started, for tests.
	statsStarted atomic.Int64

	// scanMu guards scanning, the search of the mount namespaces in flight, and nextScan, the
	// one that follows it for the calls that came meanwhile (scanNamespaces).
	scanMu   sync.Mutex
	scanning *scanRun
	nextScan *scanRun
	// lastScan is the search that began last of those that ended; a probe may take its answer
	// (StaleInPods). repaired holds when Repair last changed the mounts of each volume, for the
	// last staleSearchReuse: a probe of the volume takes no search begun before that.
	lastScan *scanRun
	repaired map[string]time.Time
	// scansRun counts the searches ever run, for tests.
	scansRun atomic.Int64

	// nsMu guards nsTables, the mount tables of the namespaces the last search read, kept open
	// while searches follow each other (the probes and repairs of a restart) so that the next
	// search reads again only those that changed (polledTable). An open table keeps its namespace,
	// and the mounts in it, alive, and holds a descriptor: a table is closed when a search no
	// longer finds a process of its namespace, and all are closed when a search ends with no
	// other waiting (runScan).
	nsMu     sync.Mutex
	nsTables map[string]*nsTable
}

// nsTable is the open mount table of one namespace and its mounts that nothing is stacked on.
type nsTable struct {
	t   *polledTable
	top []*mountInfo
}

// statCall is one stat running in its own goroutine; err is set before done is closed.
type statCall struct {
	started time.Time
	done    chan struct{}
	err     error
}

// Defaults of CheckerOptions.
const (
	defaultStatTimeout = 5 * time.Second
	defaultProc        = "/proc"
)

// NewChecker returns a Checker with opts' defaults filled in.
func NewChecker(opts CheckerOptions) *Checker {
	return &Checker{opts: opts.withDefaults()}
}

func (o CheckerOptions) withDefaults() CheckerOptions {
	if o.StatTimeout <= 0 {
		o.StatTimeout = defaultStatTimeout
	}
	if o.MountInfo == "" {
		o.MountInfo = selfMountInfo
	}
	if o.Proc == "" {
		o.Proc = defaultProc
	}
	return o
}

// options returns the checker's options with defaults, so that a zero Checker works too.
func (c *Checker) options() CheckerOptions {
	return c.opts.withDefaults()
}

// Check inspects the mount at path and returns what is wrong with it (nil: healthy): the path is
// stat'ed under the deadline (MountHung; a corrupted-mount error, as k8s.io/mount-utils'
// IsCorruptedMnt defines it, gives MountDisconnected with the errno in the message; a missing
// path gives MountGone), then the top-most mount at path in the mount table is compared with want
// (not mounted: MountGone; read-only: ReadOnlyMount; other source or type: WrongMountSource,
// WrongFilesystemType).
func (c *Checker) Check(ctx context.Context, path string, want Expect) []Finding {
	path = filepath.Clean(path)
	opts := c.options()
	infos, err := readMountTable(opts.MountInfo)
	if err != nil {
		return []Finding{{Path: path, Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: ReasonMountCheckFailed,
			Message: fmt.Sprintf("cannot check %s: %v", path, err)}}
	}
	top := topMount(infos, path)
	key := "path " + path
	if top != nil {
		key = "device " + device(top)
	}
	if f, ok := c.statFinding(ctx, key, path); !ok {
		return []Finding{f}
	}
	if top == nil {
		return []Finding{{Path: path, Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: ReasonMountGone,
			Message: fmt.Sprintf("nothing is mounted at %s", path)}}
	}

	var findings []Finding
	if readOnly(top) && !want.ReadOnly {
		findings = append(findings, Finding{Path: path, Status: csi.VolumeHealthErrorType_DEGRADED, Reason: ReasonReadOnlyMount,
			Message: fmt.Sprintf("%s is mounted read-only, but the volume is meant to be read-write", path)})
	}
	if source := top.Source; want.Source != "" && source != want.Source {
		findings = append(findings, Finding{Path: path, Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: ReasonWrongMountSource,
			Message: fmt.Sprintf("%s shows mount source %q, not the volume's %q", path, source, want.Source)})
	}
	if want.FSType != "" && top.FSType != want.FSType {
		findings = append(findings, Finding{Path: path, Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: ReasonWrongFilesystemType,
			Message: fmt.Sprintf("%s has a %s filesystem, not the volume's %s", path, top.FSType, want.FSType)})
	}
	return findings
}

// statFinding stats path under the stat timeout and ctx, and turns a failure into a finding
// (ok false). key names what the stat waits on (see Checker.stats).
func (c *Checker) statFinding(ctx context.Context, key, path string) (f Finding, ok bool) {
	inaccessible := func(reason, format string, args ...any) (Finding, bool) {
		return Finding{Path: path, Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: reason,
			Message: fmt.Sprintf(format, args...)}, false
	}
	timeout := c.options().StatTimeout
	call, running := c.startStat(key, path)
	if running && time.Since(call.started) >= timeout {
		return inaccessible(ReasonMountHung,
			"%s does not answer: a stat of its mount started %s ago has not returned yet; its mounter is frozen or unreachable",
			path, time.Since(call.started).Round(time.Millisecond))
	}
	// A stat still within its deadline is another check's, made at the same moment: its answer
	// is this check's too, by the same deadline, so that two checks at once (a probe and a
	// kubelet call) do not take each other's stat for a hang.
	timer := time.NewTimer(time.Until(call.started.Add(timeout)))
	defer timer.Stop()
	select {
	case <-call.done:
	case <-timer.C:
		return inaccessible(ReasonMountHung,
			"a stat of %s did not return within %s: its mounter is frozen or unreachable", path, timeout)
	case <-ctx.Done():
		return inaccessible(ReasonMountCheckFailed, "the check of %s was cut off: %v", path, context.Cause(ctx))
	}

	if f := StatFinding(path, call.err); f != nil {
		return *f, false
	}
	return Finding{}, true
}

// StatFinding turns the error of StatMount(path) into a finding: nil for no error; a missing
// path gives MountGone; a corrupted-mount error, as k8s.io/mount-utils' IsCorruptedMnt defines it,
// or ECONNABORTED gives MountDisconnected with the errno in the message; anything else
// MountCheckFailed. It is how Check reads its stat, for a caller that stats a mount its own way
// (in a child process, say).
func StatFinding(path string, err error) *Finding {
	inaccessible := func(reason, format string, args ...any) *Finding {
		return &Finding{Path: path, Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: reason,
			Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return inaccessible(ReasonMountGone, "%s does not exist", path)
	// ECONNABORTED is what a FUSE request gets when its connection is aborted under it: the
	// mounter died while the request waited, and the next one gets ENOTCONN.
	case mount.IsCorruptedMnt(err) || errors.Is(err, unix.ECONNABORTED):
		op, cause := "stat", err
		var pe *fs.PathError
		if errors.As(err, &pe) {
			op, cause = pe.Op, pe.Err
		}
		var errno unix.Errno
		if errors.As(cause, &errno) {
			cause = fmt.Errorf("%s, %w", unix.ErrnoName(errno), errno)
		}
		return inaccessible(ReasonMountDisconnected,
			"%s is disconnected: %s failed with %v: its mounter died or lost its connection", path, op, cause)
	default:
		return inaccessible(ReasonMountCheckFailed, "cannot check %s: %v", path, err)
	}
}

// startStat starts a stat of path in its own goroutine, unless one for key is still blocked:
// then it returns that one with running set, and starts nothing.
func (c *Checker) startStat(key, path string) (call *statCall, running bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if call := c.stats[key]; call != nil {
		select {
		case <-call.done:
		default:
			return call, true
		}
	}
	call = &statCall{started: time.Now(), done: make(chan struct{})}
	if c.stats == nil {
		c.stats = make(map[string]*statCall)
	}
	c.stats[key] = call
	c.statsStarted.Add(1)
	go func() {
		call.err = StatMount(path)
		close(call.done)
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.stats[key] == call {
			delete(c.stats, key)
		}
	}()
	return call, false
}

// StatMount makes the calls that reach the filesystem mounted at path, and returns the first
// error, as an *os.PathError naming the call. statfs goes first because a FUSE statfs always
// reaches the daemon, while a stat may be answered from the kernel's attribute cache and so miss a
// frozen daemon. On a frozen mount it blocks until the mounter answers: Check bounds it.
func StatMount(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	_, err := os.Stat(path)
	return err
}

// MountDevice returns the device ("major:minor", mountinfo field 3) of the top-most mount at path,
// or "" when nothing is mounted there. It reads only the mount table, so it answers for dead and
// hung mounts too.
func (c *Checker) MountDevice(path string) (string, error) {
	infos, err := readMountTable(c.options().MountInfo)
	if err != nil {
		return "", err
	}
	top := topMount(infos, path)
	if top == nil {
		return "", nil
	}
	return device(top), nil
}
