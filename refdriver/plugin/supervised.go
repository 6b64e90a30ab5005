package plugin

import (
	"context"
	"fmt"
	"time"

	"github.com/volume-healer/volume-healer/driverkit/supervisor"
)

// supervisorClient is what the plugin asks of the node's mount supervisor.
type supervisorClient interface {
	Mount(ctx context.Context, req supervisor.MountRequest) (supervisor.VolumeStatus, error)
	Unmount(ctx context.Context, volumeID string) error
	Status(ctx context.Context) (supervisor.Status, error)
}

var _ supervisorClient = (*supervisor.Client)(nil)

// superviseMount asks the supervisor to mount r's volume at its staging path and returns the
// PID of the mounter it runs. The supervisor answers at once for a volume it holds healthy,
// starts a mounter on the held connection when the volume's mounter failed, and mounts the
// volume anew when its mount is gone.
func (p *Plugin) superviseMount(ctx context.Context, r *record) (pid int, err error) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.SupervisorTimeout)
	defer cancel()
	vs, err := p.sup.Mount(ctx, supervisor.MountRequest{
		Volume: r.VolumeID,
		Source: p.store.backing(r.VolumeID),
		Target: r.StagingPath,
		FsName: r.FsName,
	})
	if err != nil {
		return 0, fmt.Errorf("%w: the mount supervisor did not mount volume %s at %s: %w", ErrMounter, r.VolumeID, r.StagingPath, err)
	}
	return vs.MounterPID, nil
}

// refreshMounterPID sets r.MounterPID to the mounter the supervisor runs for r's volume now,
// when the supervisor answers; the record on disk keeps the one of the last stage or heal.
func (p *Plugin) refreshMounterPID(r *record) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := p.sup.Status(ctx)
	if err != nil {
		p.opts.Logger.Error(err, "Asking the mount supervisor for the volume's mounter", "volume", r.VolumeID)
		return
	}
	for _, v := range st.Volumes {
		if v.Volume == r.VolumeID {
			r.MounterPID = v.MounterPID
			return
		}
	}
	r.MounterPID = 0
}

// Supervised tells whether the node's mount supervisor holds the volume's mount and runs its
// mounter: then the volume lives through a restart of this plugin (its mounter is not in the
// plugin's process group) and through the death of its mounter (the supervisor keeps the FUSE
// connection and starts a new mounter on it). False for a volume not staged on this node.
func (p *Plugin) Supervised(volumeID string) bool {
	r, ok := p.record(volumeID)
	return ok && r.Supervised
}
