package supervisor

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
)

// MountFunc mounts a FUSE file system at target, with fsName as its source in the mount table,
// and returns the /dev/fuse descriptor of the new connection. Nobody serves the connection yet:
// the mounter started on the descriptor does.
type MountFunc func(target, fsName string) (*os.File, error)

// Options configure a Supervisor. Zero values take the defaults documented on each field.
type Options struct {
	// StateDir holds what outlives one supervisor process on the node: the handover socket
	// (<StateDir>/handover.sock), the mounters' state folders (<StateDir>/mounters/<volume>/,
	// which a mounter that takes a connection over reads) and the instances that handed their
	// mounts over (<StateDir>/retired/). Two supervisors of the same node share it, the old and
	// the new one of an upgrade. Required.
	StateDir string

	// Socket is the UNIX socket the supervisor serves the node plugin on. A supervisor that
	// takes the mounts over from a running one serves the socket it receives from it instead.
	// Required.
	Socket string

	// Instance names this supervisor among those that ever ran on StateDir, such as its pod's
	// name: an instance that handed its mounts over never takes them back, even when it is
	// started again. Default: the host name.
	Instance string

	// MounterCommand is the program and leading arguments that start a mounter; the supervisor
	// appends the mounter's flags: --source, --fuse-fd, --state-dir, --ready-fd, --fsname and,
	// when the mounter takes over a live connection, --takeover. Required.
	MounterCommand []string

	// Subtype is the FUSE subtype of the mounts: they show as type fuse.<Subtype> in the mount
	// table, and the mounts of that type that nobody holds are reported by Status. Default:
	// none, type fuse.
	Subtype string

	// Mount makes the FUSE mount of a volume. Default: fuseconn.Mount with the volume's fsname,
	// Subtype and allow_other.
	Mount MountFunc

	// MaxMounts bounds the volumes the supervisor holds; Mount refuses a volume past it.
	// Default: 64.
	MaxMounts int

	// MaxRestarts bounds the restarts of one volume's mounter within RestartWindow; past it the
	// volume is reported failed and its FUSE connection is kept (requests wait, nothing
	// fails) until a Mount of the volume or an Unmount. Default: 5.
	MaxRestarts int

	// RestartWindow is the window MaxRestarts counts in. Default: 10m.
	RestartWindow time.Duration

	// RestartBackoff is the wait before the second restart of a mounter within RestartWindow
	// (the first one is at once); it doubles with each further restart, up to
	// MaxRestartBackoff. Default: 100ms.
	RestartBackoff time.Duration

	// MaxRestartBackoff caps RestartBackoff's doubling. Default: 5s.
	MaxRestartBackoff time.Duration

	// ReadyTimeout bounds how long a mounter may take to write its ready line. Default: 10s.
	ReadyTimeout time.Duration

	// StopTimeout is how long a mounter may take to exit after SIGTERM before it is killed.
	// Default: 10s.
	StopTimeout time.Duration

	// MounterOutput receives the mounters' standard output and error. Default: os.Stderr.
	MounterOutput io.Writer

	// MountInfo is the mount table the supervisor reads. Default: /proc/self/mountinfo.
	MountInfo string

	// FuseControl is the fusectl folder the connections' waiting counts are read from.
	// Default: /sys/fs/fuse/connections.
	FuseControl string

	// Logger receives one line per mount, unmount, mounter start, exit and restart, and
	// handover. Default: discard.
	Logger logr.Logger
}

func (o *Options) setDefaults() error {
	if o.StateDir == "" {
		return fmt.Errorf("%w: StateDir is required", ErrInvalidOptions)
	}
	if o.Socket == "" {
		return fmt.Errorf("%w: Socket is required", ErrInvalidOptions)
	}
	if len(o.MounterCommand) == 0 || o.MounterCommand[0] == "" {
		return fmt.Errorf("%w: MounterCommand names no program", ErrInvalidOptions)
	}
	if o.Instance == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("%w: Instance is not set and the host name is unknown: %w", ErrInvalidOptions, err)
		}
		o.Instance = h
	}
	if filepath.Base(o.Instance) != o.Instance || o.Instance == "." || o.Instance == ".." {
		return fmt.Errorf("%w: Instance %q must be a plain name, without /", ErrInvalidOptions, o.Instance)
	}
	if o.Mount == nil {
		o.Mount = defaultMount(o.Subtype)
	}
	if o.MaxMounts == 0 {
		o.MaxMounts = 64
	}
	if o.MaxRestarts == 0 {
		o.MaxRestarts = 5
	}
	if o.MaxMounts < 0 || o.MaxRestarts < 0 {
		return fmt.Errorf("%w: MaxMounts and MaxRestarts must be positive, got %d and %d", ErrInvalidOptions, o.MaxMounts, o.MaxRestarts)
	}
	defaults := []struct {
		name string
		d    *time.Duration
		def  time.Duration
	}{
		{"RestartWindow", &o.RestartWindow, 10 * time.Minute},
		{"RestartBackoff", &o.RestartBackoff, 100 * time.Millisecond},
		{"MaxRestartBackoff", &o.MaxRestartBackoff, 5 * time.Second},
		{"ReadyTimeout", &o.ReadyTimeout, 10 * time.Second},
		{"StopTimeout", &o.StopTimeout, 10 * time.Second},
	}
	for _, d := range defaults {
		if *d.d == 0 {
			*d.d = d.def
		}
		if *d.d < 0 {
			return fmt.Errorf("%w: %s must not be negative, got %s", ErrInvalidOptions, d.name, *d.d)
		}
	}
	if o.MounterOutput == nil {
		o.MounterOutput = os.Stderr
	}
	if o.MountInfo == "" {
		o.MountInfo = "/proc/self/mountinfo"
	}
	if o.FuseControl == "" {
		o.FuseControl = "/sys/fs/fuse/connections"
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	return nil
}

// fsType is the type the supervisor's mounts show in the mount table.
func (o *Options) fsType() string {
	if o.Subtype == "" {
		return "fuse"
	}
	return "fuse." + o.Subtype
}
