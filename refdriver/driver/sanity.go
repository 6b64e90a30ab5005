package driver

import (
	"context"
	"time"

	"github.com/volume-healer/volume-healer/api/healer/sanity"
)

// SanityControl breaks volumes through the reference driver's control socket for the Healer
// protocol's conformance check: the sanity.VolumeControl of `healerctl sanity --control`, and of
// the real-mode plugin's own conformance test. The check's fault names are the driver's
// conditions.
type SanityControl struct {
	Client *ControlClient
}

var _ sanity.VolumeControl = SanityControl{}

// SetFault puts the volume volumeID in fault f; hang is how long calls block for sanity.Hung.
func (s SanityControl) SetFault(ctx context.Context, volumeID string, f sanity.Fault, hang time.Duration) error {
	_, err := s.Client.SetCondition(ctx, volumeID, Condition(f), hang)
	return err
}

// SetStaged marks the volume volumeID as staged or not staged on the driver's node.
func (s SanityControl) SetStaged(ctx context.Context, volumeID string, staged bool) error {
	_, err := s.Client.SetStaged(ctx, volumeID, staged)
	return err
}
