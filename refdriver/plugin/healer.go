package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/driverkit"
)

// The plugin is healed through driverkit: these four methods are all it adds to the kit.
var _ driverkit.Driver = (*Plugin)(nil)

// Volume returns the record of a volume staged on this node. A volume that exists but is not
// staged here is not found (the kit answers FAILED_PRECONDITION); a volume the plugin never
// created is driverkit.ErrVolumeNotFound (NOT_FOUND).
func (p *Plugin) Volume(_ context.Context, volumeID string) (driverkit.Volume, bool, error) {
	if r, ok := p.record(volumeID); ok {
		return r.kitVolume(), true, nil
	}
	known, err := p.known(volumeID)
	if err != nil {
		return driverkit.Volume{}, false, fmt.Errorf("look up volume %q: %w", volumeID, err)
	}
	if !known {
		return driverkit.Volume{}, false, fmt.Errorf("%w: %q was not created by this driver", driverkit.ErrVolumeNotFound, volumeID)
	}
	return driverkit.Volume{}, false, nil
}

// StagedVolumes lists the volumes staged on this node.
func (p *Plugin) StagedVolumes(context.Context) ([]driverkit.Volume, error) {
	records := p.recordList()
	out := make([]driverkit.Volume, 0, len(records))
	for _, r := range records {
		out = append(out, r.kitVolume())
	}
	return out, nil
}

// Inspect reports a volume whose backing folder is gone as DATA_LOSS, and as not healable: a
// new mounter would serve an empty folder, which must not pass for the volume.
func (p *Plugin) Inspect(_ context.Context, v driverkit.Volume) (findings []driverkit.Finding, healable bool) {
	backing := p.store.backing(v.ID)
	_, err := os.Stat(backing)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return []driverkit.Finding{{
			Status:  csi.VolumeHealthErrorType_DATA_LOSS,
			Reason:  driverkit.ReasonDataLoss,
			Message: fmt.Sprintf("the data of volume %s is lost: its backing folder %s is gone; restore it from a backup", v.ID, backing),
		}}, false
	case err != nil:
		return []driverkit.Finding{{
			Status:  csi.VolumeHealthErrorType_INACCESSIBLE,
			Reason:  "BackingFolderUnreadable",
			Message: fmt.Sprintf("the backing folder of volume %s cannot be read: %v", v.ID, err),
		}}, true
	}
	return nil, true
}

// Remount kills what is left of the volume's mounter (SIGKILL, which a stopped one obeys too)
// and starts a new one at the staging path. A supervised volume's mounter is never killed
// here: the supervisor is asked to mount the volume again, which mounts it anew when its mount
// is gone (the kit's repair detached the dead one) and starts a mounter on the held connection
// when its mounter failed. The caller holds the volume's lock.
func (p *Plugin) Remount(ctx context.Context, v driverkit.Volume) error {
	r, ok := p.record(v.ID)
	if !ok {
		return fmt.Errorf("volume %s is no longer staged", v.ID)
	}
	log := klog.FromContext(ctx).WithValues("volume", v.ID)
	old := r.MounterPID
	if !r.Supervised {
		if err := p.stopMounter(r, false); err != nil {
			return err
		}
	}
	p.cancelResume(v.ID)
	pid, err := p.startMounter(ctx, r)
	if err != nil {
		return err
	}
	r.MounterPID = pid
	if err := p.saveRecord(r); err != nil {
		return err
	}
	log.Info("Mounter restarted", "stagingPath", r.StagingPath, "oldPID", old, "pid", pid, "supervised", r.Supervised)
	return nil
}
