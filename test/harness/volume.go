package harness

import (
	"context"
	"errors"
	"time"

	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/test/fixtures"
)

// DriverControl reads and sets the condition of a reference driver's volumes: a driver in this
// process (Plugin.Control) or a driver process through its control socket (*simulated.ControlClient).
type DriverControl interface {
	Volume(ctx context.Context, id string) (simulated.Volume, error)
	SetCondition(ctx context.Context, id string, c control.Condition, hang time.Duration) (simulated.Volume, error)
}

// Volume is one test volume: its API objects as test/fixtures shapes them, and the driver that
// serves it.
type Volume struct {
	fixtures.CephVolume
	// Control reaches the driver of the volume's node.
	Control DriverControl
	// BrokenAt is when SetCondition last set the volume's condition, Broken that condition;
	// DetachedAt is when Fixture.Detach began deleting its VolumeAttachment.
	BrokenAt   time.Time
	Broken     control.Condition
	DetachedAt time.Time
}

// Spec is the volume as the reference driver adds it.
func (v *Volume) Spec() simulated.VolumeSpec {
	return simulated.VolumeSpec{ID: v.Handle, Mounter: v.Mounter, VolumeContext: v.Attributes()}
}

// Specs are the volumes as the reference driver adds them.
func Specs(vols []*Volume) []simulated.VolumeSpec {
	out := make([]simulated.VolumeSpec, len(vols))
	for i, v := range vols {
		out[i] = v.Spec()
	}
	return out
}

// Condition returns the driver's condition of the volume.
func (v *Volume) Condition(t TB) control.Condition {
	t.Helper()
	got, err := v.Control.Volume(t.Context(), v.Handle)
	if err != nil {
		t.Fatalf("volume %s: %v", v.PV, err)
	}
	return got.Condition
}

// SetCondition breaks (or restores) the volume in its driver, and records when and how; hang
// applies to control.Hung. A driver in this process takes it while its plugin is stopped too, as
// it keeps its volumes on disk.
func (v *Volume) SetCondition(t TB, c control.Condition, hang time.Duration) {
	t.Helper()
	if _, err := v.Control.SetCondition(t.Context(), v.Handle, c, hang); err != nil {
		t.Fatalf("set %s %s: %v", v.PV, c, err)
	}
	v.BrokenAt, v.Broken = time.Now(), c
}

// errNotStarted is what a Plugin's Control says before the plugin's first start.
var errNotStarted = errors.New("the node plugin has not started yet")
