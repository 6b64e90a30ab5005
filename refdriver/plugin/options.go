package plugin

import (
	"fmt"
	"io"
	"os"
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
	// UNIMPLEMENTED. Default: PROBE, HEAL and LIST_VOLUMES.
	Capabilities []healerv1alpha1.HealerCapability_RPC_Type

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
	if o.MounterOutput == nil {
		o.MounterOutput = os.Stderr
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 10 * time.Second
	}
	if o.StopTimeout == 0 {
		o.StopTimeout = 5 * time.Second
	}
	for name, d := range map[string]time.Duration{"StatTimeout": o.StatTimeout, "ReadyTimeout": o.ReadyTimeout, "StopTimeout": o.StopTimeout} {
		if d < 0 {
			return fmt.Errorf("%w: %s must not be negative, got %s", control.ErrInvalidOptions, name, d)
		}
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	return nil
}
