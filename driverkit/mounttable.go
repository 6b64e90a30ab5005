package driverkit

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// mountInfo is one line of a mount table, its paths unescaped (a mount point with a space shows
// as \040 in the file).
type mountInfo = mountinfo.Info

// selfMountInfo is the mount table of the calling process's mount namespace.
const selfMountInfo = "/proc/self/mountinfo"

// readMountTable parses a mountinfo file.
func readMountTable(file string) ([]*mountInfo, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("read mount table %s: %w", file, err)
	}
	defer f.Close()
	infos, err := mountinfo.GetMountsFromReader(f, nil)
	if err != nil {
		return nil, fmt.Errorf("read mount table %s: %w", file, err)
	}
	return infos, nil
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
