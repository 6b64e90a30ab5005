package plugin

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/go-logr/logr"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/refdriver/control"
)

// Options configure a Plugin. Zero values take the defaults documented on each field.
type Options struct {
	// StateDir holds the volumes (<StateDir>/volumes/<id>/ is a volume's data, <id>.json its
	// description), the records of the volumes staged on this node (<StateDir>/staged/), the
	// nodes volumes are published to (<StateDir>/attachments/) and the nodes plugins played on
	// this folder (<StateDir>/nodes/), so that all survive a restart of the plugin. Two plugins
	// may share it, one serving the Controller calls and one the Node calls, on one machine.
	// Required.
	StateDir string

	// Identity is the plugin's name, version and node; the driver name is also the prefix of
	// the mount source of every staging mount.
	control.Identity

	// StatTimeout bounds the stat that finds hung mounts (driverkit.CheckerOptions.StatTimeout).
	// Default: 5s.
	StatTimeout time.Duration

	// Capabilities lists the Healer RPCs to advertise and serve; the others answer
	// UNIMPLEMENTED. Default: PROBE, HEAL and LIST_VOLUMES. Must be empty with Stock.
	Capabilities []healerv1alpha1.HealerCapability_RPC_Type

	// Stock makes the plugin a driver as operators run them today, one that knows nothing of
	// volume-healer: it serves no Healer service (the CSI-Addons socket carries the CSI-Addons
	// Identity only, without the Healer protocol in its manifest), and its NodeStageVolume and
	// NodePublishVolume repair a corrupted mount themselves, the way ceph-csi's do for
	// ceph-fuse. NodeStageVolume on a staging path whose mount is dead, hung or gone detaches
	// it and starts the mounter again; NodePublishVolume restores the staging mount first when
	// it is broken (kubelet does not stage a volume again while it counts it staged, so a
	// replacement pod gets only NodePublishVolume), and replaces a broken mount at the target
	// instead of stacking on it. Neither touches the volume's other publish targets: pods
	// that kept a dead mount keep it until they are replaced. Default: false, the Healer
	// driver.
	Stock bool

	// UnmountDeadTargetsOnStart makes New detach the dead or hung mounts of the recorded
	// publish targets, as the start-up clean-up of some drivers does, and keep the folders and
	// the records: kubelet still counts those targets published, their pods see an empty
	// folder on the node's disk (propagation HostToContainer) or keep the dead mount (None).
	// It reproduces the worst case of a driver restart, for tests. Stock only. Default: false.
	UnmountDeadTargetsOnStart bool

	// Mounter is the userspace mounter of the volumes this plugin stages. Volumes staged
	// already keep theirs. Default: OwnMounter.
	Mounter Mounter

	// RcloneCommand is the program and leading arguments that run rclone, for RcloneMounter;
	// the plugin appends `mount` and its arguments. Default: "rclone" from the PATH.
	RcloneCommand []string

	// MounterCommand is the program and leading arguments that start a mounter; the plugin
	// appends the mounter's flags (--source, --target, --fsname, --ready-fd). Default: this
	// program (os.Executable) with the argument "mounter".
	MounterCommand []string

	// MounterOutput receives the mounters' standard output and error. Default: os.Stderr.
	MounterOutput io.Writer

	// ReadyTimeout bounds how long a new mounter may take to mount. Default: 10s.
	ReadyTimeout time.Duration

	// StopTimeout is how long NodeUnstageVolume lets a mounter unmount cleanly after SIGTERM
	// before it kills it. Default: 5s.
	StopTimeout time.Duration

	// SupervisorSocket is the socket of the node's mount supervisor (package
	// driverkit/supervisor). When set, the volumes staged from now on are mounted by it: it
	// holds their FUSE connections and runs their mounters, so that a restart of the plugin
	// kills none of them and a mounter that dies is replaced on the live connection. The
	// plugin then never kills or unmounts a supervised mounter: its unstage and its heals ask
	// the supervisor. Own mounter only; not with Stock. Default: none, the plugin runs the
	// mounters itself.
	SupervisorSocket string

	// SupervisorTimeout bounds each call to the supervisor. Default: 60s.
	SupervisorTimeout time.Duration

	// Logger receives one line per stage, unstage, heal and fault. Default: discard.
	Logger logr.Logger
}

func (o *Options) setDefaults() error {
	if o.StateDir == "" {
		return fmt.Errorf("%w: StateDir is required", control.ErrInvalidOptions)
	}
	o.Identity = o.Identity.WithDefaults()
	if o.StatTimeout == 0 {
		o.StatTimeout = 5 * time.Second
	}
	if o.MounterCommand == nil {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("%w: find this program to run it as the mounter: %w", control.ErrInvalidOptions, err)
		}
		o.MounterCommand = []string{exe, "mounter"}
	}
	if len(o.MounterCommand) == 0 || o.MounterCommand[0] == "" {
		return fmt.Errorf("%w: MounterCommand names no program", control.ErrInvalidOptions)
	}
	switch o.Mounter {
	case "":
		o.Mounter = OwnMounter
	case OwnMounter, RcloneMounter:
	default:
		return fmt.Errorf("%w: Mounter %q: want %s or %s", control.ErrInvalidOptions, o.Mounter, OwnMounter, RcloneMounter)
	}
	if o.RcloneCommand == nil {
		o.RcloneCommand = []string{"rclone"}
	}
	if len(o.RcloneCommand) == 0 || o.RcloneCommand[0] == "" {
		return fmt.Errorf("%w: RcloneCommand names no program", control.ErrInvalidOptions)
	}
	if o.Mounter == RcloneMounter {
		if _, err := exec.LookPath(o.RcloneCommand[0]); err != nil {
			return fmt.Errorf("%w: Mounter %s needs the rclone program (Debian package rclone): %w", control.ErrInvalidOptions, o.Mounter, err)
		}
		// rclone mounts through fusermount, found on the PATH (Debian package fuse3).
		if _, err := exec.LookPath("fusermount"); err != nil {
			return fmt.Errorf("%w: Mounter %s needs fusermount (Debian package fuse3): %w", control.ErrInvalidOptions, o.Mounter, err)
		}
	}
	if o.Stock && len(o.Capabilities) > 0 {
		return fmt.Errorf("%w: a Stock plugin serves no Healer service, so Capabilities must be empty, got %v", control.ErrInvalidOptions, o.Capabilities)
	}
	if o.UnmountDeadTargetsOnStart && !o.Stock {
		return fmt.Errorf("%w: UnmountDeadTargetsOnStart is the start-up clean-up of a stock driver: set Stock too", control.ErrInvalidOptions)
	}
	if o.SupervisorSocket != "" {
		if o.Stock {
			return fmt.Errorf("%w: SupervisorSocket: a Stock plugin runs its mounters itself, as drivers do today; drop one of them", control.ErrInvalidOptions)
		}
		if o.Mounter != OwnMounter {
			return fmt.Errorf("%w: SupervisorSocket: the mount supervisor runs the %s mounter only, not %s", control.ErrInvalidOptions, OwnMounter, o.Mounter)
		}
	}
	if o.SupervisorTimeout == 0 {
		o.SupervisorTimeout = 60 * time.Second
	}
	if o.MounterOutput == nil {
		o.MounterOutput = os.Stderr
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 10 * time.Second
	}
	if o.StopTimeout == 0 {
		o.StopTimeout = 5 * time.Second
	}
	for name, d := range map[string]time.Duration{"StatTimeout": o.StatTimeout, "ReadyTimeout": o.ReadyTimeout, "StopTimeout": o.StopTimeout, "SupervisorTimeout": o.SupervisorTimeout} {
		if d < 0 {
			return fmt.Errorf("%w: %s must not be negative, got %s", control.ErrInvalidOptions, name, d)
		}
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	return nil
}
