package fuseconn

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// MountOptions configure Mount. Zero values take the defaults documented on each field.
type MountOptions struct {
	// Subtype names the file system: the mount's type is "fuse.<Subtype>". Required.
	Subtype string
	// FsName is the mount's source in the mount table. Default: Subtype.
	FsName string
	// AllowOther lets users other than the mounting one use the mount. Default: false.
	AllowOther bool
	// DefaultPermissions has the kernel check file modes itself instead of leaving access checks
	// to the server. Default: false.
	DefaultPermissions bool
	// ReadOnly mounts the file system read-only. Default: false.
	ReadOnly bool
	// MaxRead bounds the size of a read request; 0 leaves the kernel's default.
	MaxRead int
}

// Mount opens /dev/fuse and mounts a FUSE file system at target (an existing folder) served
// through it, and returns the open device. The connection lives as long as any descriptor of
// that file is open: a holder of the file (or of a duplicate passed to another process) keeps the
// mount's open files and inode numbers alive while its server is replaced. The mount is owned by
// the calling process's effective user and group, is nosuid and nodev, and serves nothing until
// a Session (or another FUSE server) reads from the returned file; a stat of target blocks until
// then.
func Mount(target string, o MountOptions) (*os.File, error) {
	if o.Subtype == "" || strings.ContainsAny(o.Subtype, ", ") {
		return nil, fmt.Errorf("%w: mount %s: the subtype %q must be set and have no comma or space", ErrInvalidOptions, target, o.Subtype)
	}
	if strings.Contains(o.FsName, ",") {
		return nil, fmt.Errorf("%w: mount %s: the fsname %q must have no comma", ErrInvalidOptions, target, o.FsName)
	}
	if o.MaxRead < 0 {
		return nil, fmt.Errorf("%w: mount %s: MaxRead must not be negative, got %d", ErrInvalidOptions, target, o.MaxRead)
	}
	fi, err := os.Stat(target)
	if err != nil {
		return nil, fmt.Errorf("mount FUSE at %s: %w", target, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%w: mount FUSE at %s: not a folder", ErrInvalidOptions, target)
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("mount FUSE at %s: open /dev/fuse: %w", target, err)
	}
	dev := os.NewFile(uintptr(fd), "/dev/fuse")
	data := []string{
		fmt.Sprintf("fd=%d", fd),
		fmt.Sprintf("rootmode=%o", unix.S_IFDIR),
		fmt.Sprintf("user_id=%d", os.Geteuid()),
		fmt.Sprintf("group_id=%d", os.Getegid()),
	}
	if o.AllowOther {
		data = append(data, "allow_other")
	}
	if o.DefaultPermissions {
		data = append(data, "default_permissions")
	}
	if o.MaxRead > 0 {
		data = append(data, fmt.Sprintf("max_read=%d", o.MaxRead))
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if o.ReadOnly {
		flags |= unix.MS_RDONLY
	}
	source := o.FsName
	if source == "" {
		source = o.Subtype
	}
	if err := unix.Mount(source, target, "fuse."+o.Subtype, flags, strings.Join(data, ",")); err != nil {
		_ = dev.Close()
		return nil, fmt.Errorf("mount FUSE at %s (type fuse.%s): %w", target, o.Subtype, err)
	}
	return dev, nil
}

// KernelResends says whether the running kernel is one that resends a dead server's unanswered
// requests to the server that takes its connection over (FUSE_NOTIFY_RESEND, Linux 6.9 and
// later), from its release number. A connection tells for sure in its INIT
// (InitParams.CanResend); this answers before any connection exists, for a driver's
// capabilities. A kernel that backports the feature under an older number answers false.
func KernelResends() bool {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false
	}
	return releaseAtLeast(unix.ByteSliceToString(u.Release[:]), 6, 9)
}

// releaseAtLeast says whether a kernel release such as "6.18.0-1-amd64" is major.minor or later.
func releaseAtLeast(release string, major, minor int) bool {
	var ma, mi int
	if n, _ := fmt.Sscanf(release, "%d.%d", &ma, &mi); n != 2 {
		return false
	}
	return ma > major || ma == major && mi >= minor
}
