package driverkit

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"
)

// mountInfo is one line of a mount table.
type mountInfo = mount.MountInfo

// selfMountInfo is the mount table of the calling process's mount namespace.
const selfMountInfo = "/proc/self/mountinfo"

// readMountTable parses a mountinfo file.
func readMountTable(file string) ([]mountInfo, error) {
	infos, err := mount.ParseMountInfo(file)
	if err != nil {
		return nil, fmt.Errorf("read mount table %s: %w", file, err)
	}
	return infos, nil
}

// topMount returns the top-most mount at path in infos, or nil when nothing is mounted there.
// Stacked mounts at one path appear in mount order, each the child of the one below it, so the
// top-most is the last one that no other mount at the same path has as its parent.
func topMount(infos []mountInfo, path string) *mountInfo {
	path = filepath.Clean(path)
	var top *mountInfo
	for i := range infos {
		m := &infos[i]
		if unescapeMountPath(m.MountPoint) != path || hasChildAt(infos, m) {
			continue
		}
		top = m
	}
	return top
}

// hasChildAt reports whether another mount in infos is stacked directly on m (mounted at the
// same mount point with m as its parent).
func hasChildAt(infos []mountInfo, m *mountInfo) bool {
	for i := range infos {
		c := &infos[i]
		if c.ParentID == m.ID && c.ID != m.ID && c.MountPoint == m.MountPoint {
			return true
		}
	}
	return false
}

// device formats a mount's device as mountinfo field 3 shows it.
func device(m *mountInfo) string {
	return strconv.Itoa(m.Major) + ":" + strconv.Itoa(m.Minor)
}

// TopMount returns the top-most mount at path in a mount table that k8s.io/mount-utils'
// ParseMountInfo read, or nil when nothing is mounted there. Mount points are compared after the
// kernel's octal escapes are undone.
func TopMount(infos []mount.MountInfo, path string) *mount.MountInfo { return topMount(infos, path) }

// ReadOnlyMount reports whether a mount of a mount table is read-only, by its own flag (a
// read-only bind mount) or by its superblock's (a filesystem remounted read-only after errors).
func ReadOnlyMount(m *mount.MountInfo) bool { return readOnly(m) }

// readOnly reports whether a mount is read-only, either by its own flag (a read-only bind mount)
// or by its superblock's (a filesystem remounted read-only after errors).
func readOnly(m *mountInfo) bool {
	return slices.Contains(m.MountOptions, "ro") || slices.Contains(m.SuperOptions, "ro")
}

// unescapeMountPath undoes the octal escapes (\040 for a space, \011, \012, \134) the kernel
// writes for the characters of a mount point that would break the mountinfo format.
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
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
