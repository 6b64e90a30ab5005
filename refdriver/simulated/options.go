package simulated

import (
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/refdriver/control"
)

// Options configure a Driver. Zero values take the defaults documented on each field.
type Options struct {
	// StateDir is the folder that holds one JSON file per volume, so that the volumes survive a
	// restart of the driver. Required.
	StateDir string

	// Identity is the driver's name, version and node; the driver name is also used in
	// staging paths.
	control.Identity

	// StagingRoot is the kubelet CSI plugin folder under which new volumes get their staging
	// paths (<StagingRoot>/<DriverName>/<sha256(volume ID)>/globalmount). Nothing is mounted
	// there: the path is only reported. Default: healerv1alpha1.DefaultKubeletCSIPluginDir.
	StagingRoot string

	// HealMounters lists the mounters (volume context key "mounter") whose volumes this driver
	// can heal, like a driver that can restart rbd-nbd but cannot repair a kernel rbd mapping. It
	// is advertised as the capability attribute "healMounters". Default: ["rbd-nbd", "fuse"].
	HealMounters []string

	// Capabilities lists the Healer RPCs the driver advertises and serves; the others answer
	// UNIMPLEMENTED. Default: PROBE, HEAL and LIST_VOLUMES.
	Capabilities []healerv1alpha1.HealerCapability_RPC_Type

	// VolumeKeeping lists the restarts that the driver's kept volumes live through, advertised
	// as VolumeKeeping capabilities, as a driver whose mounters run outside its node plugin (in
	// driverkit's mount supervisor) does. Nothing is mounted here, so nothing lives or dies:
	// the option lets a test see what the controller does with a driver that keeps its volumes
	// alive. Default: none.
	VolumeKeeping []healerv1alpha1.HealerCapability_VolumeKeeping_Type

	// KeepMounters lists the mounters (volume context key "mounter") whose volumes the driver
	// keeps alive across the restarts VolumeKeeping names: their probes answer kept=true. It
	// needs VolumeKeeping, since a driver that advertises no keeping keeps nothing. Default:
	// none.
	KeepMounters []string

	// SeedVolumes are created (healthy, staged, mounter "rbd-nbd") on the first start, when
	// StateDir holds no volume folder yet. Later starts load the volumes from disk and ignore
	// SeedVolumes. Default: vol-1 to vol-5.
	SeedVolumes []string

	// DefaultHang is how long a call on a hung volume blocks when the volume was made hung
	// without a duration. Default: 30s.
	DefaultHang time.Duration

	// Clock times the hang of hung volumes. Default: the real clock.
	Clock clock.Clock

	// Logger receives one line per heal and per state change. Default: discard.
	Logger logr.Logger
}

func (o *Options) setDefaults() error {
	if o.StateDir == "" {
		return fmt.Errorf("%w: StateDir is required", control.ErrInvalidOptions)
	}
	o.Identity = o.Identity.WithDefaults()
	if o.StagingRoot == "" {
		o.StagingRoot = healerv1alpha1.DefaultKubeletCSIPluginDir
	}
	if o.HealMounters == nil {
		o.HealMounters = []string{"rbd-nbd", "fuse"}
	}
	if o.Capabilities == nil {
		o.Capabilities = []healerv1alpha1.HealerCapability_RPC_Type{
			healerv1alpha1.HealerCapability_RPC_PROBE,
			healerv1alpha1.HealerCapability_RPC_HEAL,
			healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES,
		}
	}
	seen := map[healerv1alpha1.HealerCapability_VolumeKeeping_Type]bool{}
	for _, t := range o.VolumeKeeping {
		switch {
		case t == healerv1alpha1.HealerCapability_VolumeKeeping_UNKNOWN || healerv1alpha1.HealerCapability_VolumeKeeping_Type_name[int32(t)] == "":
			return fmt.Errorf("%w: VolumeKeeping lists type %d, which the protocol does not define", control.ErrInvalidOptions, t)
		case seen[t]:
			return fmt.Errorf("%w: VolumeKeeping lists %s twice", control.ErrInvalidOptions, t)
		}
		seen[t] = true
	}
	if len(o.KeepMounters) > 0 && len(o.VolumeKeeping) == 0 {
		return fmt.Errorf("%w: KeepMounters %v needs VolumeKeeping: a driver that advertises no keeping must not report a volume kept", control.ErrInvalidOptions, o.KeepMounters)
	}
	if o.SeedVolumes == nil {
		o.SeedVolumes = []string{"vol-1", "vol-2", "vol-3", "vol-4", "vol-5"}
	}
	if o.DefaultHang == 0 {
		o.DefaultHang = 30 * time.Second
	}
	if o.DefaultHang < 0 {
		return fmt.Errorf("%w: DefaultHang must not be negative, got %s", control.ErrInvalidOptions, o.DefaultHang)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	return nil
}
