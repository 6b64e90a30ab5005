package driverkit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// mountInfo is one line of a mount table, its paths unescaped (a mount point with a space shows
// as \040 in the file).
type mountInfo = mountinfo.Info

// selfMountInfo is the mount table of the calling process's mount namespace.
const selfMountInfo = "/proc/self/mountinfo"

// readMountTable parses a mountinfo file. /proc/self/mountinfo is kept open and read again only
// when the mount namespace changed since the last read (selfTable); any other file is read at
// each call.
func readMountTable(file string) ([]*mountInfo, error) {
	if file == selfMountInfo {
		if infos, ok, err := selfTable.read(); ok || err != nil {
			return infos, err
		}
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("read mount table %s: %w", file, err)
	}
	defer f.Close()
	return parseMountTable(file, f)
}

func parseMountTable(file string, r io.Reader) ([]*mountInfo, error) {
	infos, err := mountinfo.GetMountsFromReader(r, nil)
	if err != nil {
		return nil, fmt.Errorf("read mount table %s: %w", file, err)
	}
	return infos, nil
}

// selfTable is the calling process's mount table, kept open.
var selfTable = &sharedTable{file: selfMountInfo}

// sharedTable is a polledTable that the calls of the whole process share, opened at the first.
type sharedTable struct {
	mu   sync.Mutex
	file string
	t    *polledTable
	// off: the file cannot be polled (not the kernel's); every call reads it.
	off bool
}

// read returns the table and ok, or ok=false when the caller must read the file itself.
func (s *sharedTable) read() (infos []*mountInfo, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.off {
		return nil, false, nil
	}
	if s.t == nil {
		t, err := openPolledTable(s.file)
		if errors.Is(err, errNotPollable) {
			s.off = true
			return nil, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		s.t = t
	}
	infos, _, err = s.t.read()
	if err != nil {
		s.t.close()
		s.t = nil
		return nil, false, err
	}
	return slices.Clone(infos), true, nil
}

// polledTable is a mount table of the kernel (/proc/PID/mountinfo) kept open and parsed, and
// parsed again only when the kernel says the table's mount namespace changed: poll(2) on an open
// mountinfo file reports POLLPRI once after each change of the namespace's mounts (a mount, an
// unmount, a mount propagated from another namespace), counting from the open or the previous
// poll. read polls first and reads after, so what changed before the call is in what it
// returns. A node plugin's restart makes every probe and repair read tables of every pod's
// mounts, several times each; that was most of the plugin's CPU, and the tables seldom change
// between two reads. Its users serialize their calls.
type polledTable struct {
	file string
	// fd is a descriptor of its own, not an *os.File: registered with Go's poller, the file
	// would be polled there too, and those polls would take the change reports.
	fd    int
	infos []*mountInfo
	read0 bool
}

// tableReads counts the reads of kept-open tables, for tests.
var tableReads atomic.Int64

// errNotPollable says a file is not one of the kernel's mount tables.
var errNotPollable = errors.New("not a mount table of the kernel")

// openPolledTable opens file, which must be a mountinfo file under procfs (errNotPollable).
func openPolledTable(file string) (*polledTable, error) {
	fd, err := unix.Open(file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("read mount table %s: %w", file, &fs.PathError{Op: "open", Path: file, Err: err})
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil || st.Type != unix.PROC_SUPER_MAGIC {
		_ = unix.Close(fd)
		return nil, errNotPollable
	}
	return &polledTable{file: file, fd: fd}, nil
}

// read returns the table and whether it was read anew.
func (t *polledTable) read() (infos []*mountInfo, fresh bool, err error) {
	if t.read0 && !t.changed() {
		return t.infos, false, nil
	}
	if _, err := unix.Seek(t.fd, 0, io.SeekStart); err != nil {
		return nil, false, fmt.Errorf("read mount table %s: %w", t.file, err)
	}
	infos, err = parseMountTable(t.file, bufio.NewReaderSize(fdReader(t.fd), 1<<16))
	if err != nil {
		return nil, false, err
	}
	t.infos, t.read0 = infos, true
	tableReads.Add(1)
	return infos, true, nil
}

// changed polls the table: true when its namespace's mounts changed since the last poll, or
// when the poll fails (read again to be sure).
func (t *polledTable) changed() bool {
	fds := []unix.PollFd{{Fd: int32(t.fd), Events: unix.POLLPRI}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err != nil || n > 0 && fds[0].Revents&(unix.POLLPRI|unix.POLLERR) != 0
	}
}

func (t *polledTable) close() { _ = unix.Close(t.fd) }

// fdReader reads a descriptor with read(2).
type fdReader int

func (r fdReader) Read(b []byte) (int, error) {
	for {
		n, err := unix.Read(int(r), b)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return 0, err
		case n == 0 && len(b) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// topMount returns the top-most mount at path in infos, or nil when nothing is mounted there.
// Stacked mounts at one path appear in mount order, each the child of the one below it, so the
// top-most is the last one that no other mount at the same path has as its parent.
func topMount(infos []*mountInfo, path string) *mountInfo {
	path = filepath.Clean(path)
	var top *mountInfo
	for _, m := range infos {
		if m.Mountpoint != path || hasChildAt(infos, m) {
			continue
		}
		top = m
	}
	return top
}

// hasChildAt reports whether another mount in infos is stacked directly on m (mounted at the
// same mount point with m as its parent).
func hasChildAt(infos []*mountInfo, m *mountInfo) bool {
	for _, c := range infos {
		if c.Parent == m.ID && c.ID != m.ID && c.Mountpoint == m.Mountpoint {
			return true
		}
	}
	return false
}

// topMounts returns the mounts of infos that no other mount is stacked on (hasChildAt), in one
// pass over the table.
func topMounts(infos []*mountInfo) []*mountInfo {
	type at struct {
		parent     int
		mountpoint string
	}
	covered := make(map[at]bool, len(infos))
	for _, c := range infos {
		if c.Parent != c.ID {
			covered[at{c.Parent, c.Mountpoint}] = true
		}
	}
	top := make([]*mountInfo, 0, len(infos))
	for _, m := range infos {
		if !covered[at{m.ID, m.Mountpoint}] {
			top = append(top, m)
		}
	}
	return top
}

// device formats a mount's device as mountinfo field 3 shows it.
func device(m *mountInfo) string {
	return strconv.Itoa(m.Major) + ":" + strconv.Itoa(m.Minor)
}

// mountOptions are a mount's own options (mountinfo field 6): "rw", "nosuid", ...
func mountOptions(m *mountInfo) []string { return strings.Split(m.Options, ",") }

// superOptions are the options of a mount's superblock (the last field of a mountinfo line).
func superOptions(m *mountInfo) []string { return strings.Split(m.VFSOptions, ",") }

// MountInfo is one line of a mount table as ReadMountTable returns it, its paths unescaped.
type MountInfo = mountinfo.Info

// ReadMountTable parses a mountinfo file (for example /proc/self/mountinfo), undoing the kernel's
// octal escapes in mount points and sources: the one mount-table reader of the project.
func ReadMountTable(file string) ([]*MountInfo, error) { return readMountTable(file) }

// TopMount returns the top-most mount at path in a mount table that ReadMountTable read, or nil
// when nothing is mounted there.
func TopMount(infos []*MountInfo, path string) *MountInfo { return topMount(infos, path) }

// ReadOnlyMount reports whether a mount of a mount table is read-only, by its own flag (a
// read-only bind mount) or by its superblock's (a filesystem remounted read-only after errors).
func ReadOnlyMount(m *MountInfo) bool { return readOnly(m) }

// MountDevice formats a mount's device as mountinfo field 3 shows it ("major:minor").
func MountDevice(m *MountInfo) string { return device(m) }

// readOnly reports whether a mount is read-only, either by its own flag (a read-only bind mount)
// or by its superblock's (a filesystem remounted read-only after errors).
func readOnly(m *mountInfo) bool {
	return slices.Contains(mountOptions(m), "ro") || slices.Contains(superOptions(m), "ro")
}

// perMountFlags maps the per-mount options of a mountinfo line to the mount(2) flags that set
// them again. A remount replaces every per-mount flag, so one that should change only the
// read-only flag must pass the others back.
func perMountFlags(opts []string) uintptr {
	var flags uintptr
	for _, o := range opts {
		switch o {
		case "ro":
			flags |= unix.MS_RDONLY
		case "nosuid":
			flags |= unix.MS_NOSUID
		case "nodev":
			flags |= unix.MS_NODEV
		case "noexec":
			flags |= unix.MS_NOEXEC
		case "noatime":
			flags |= unix.MS_NOATIME
		case "nodiratime":
			flags |= unix.MS_NODIRATIME
		case "relatime":
			flags |= unix.MS_RELATIME
		case "strictatime":
			flags |= unix.MS_STRICTATIME
		case "nosymfollow":
			flags |= unix.MS_NOSYMFOLLOW
		}
	}
	return flags
}
