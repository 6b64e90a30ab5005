package plugin

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/driverkit"
)

// nodeServer implements the CSI Node service. The calls that change a volume's mounts run
// under the volume's lock, which the server's interceptor takes (driverkit.Locks): they never
// overlap with each other nor with a heal of the same volume.
type nodeServer struct {
	csi.UnimplementedNodeServer
	p *Plugin
}

// NodeGetCapabilities reports staging, volume stats and volume health.
func (s *nodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	resp := &csi.NodeGetCapabilitiesResponse{}
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
	} {
		resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
}

// NodeGetInfo reports the node ID.
func (s *nodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: s.p.opts.NodeID}, nil
}

// NodeStageVolume starts the volume's mounter at the staging path. Staging a volume staged
// there already is a no-op when its mount is healthy, and repairs it otherwise: the Healer
// driver repairs its publish targets too, as a heal; a Stock one only mounts the staging path
// again.
func (s *nodeServer) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case staging == "":
		return nil, status.Error(codes.InvalidArgument, "staging_target_path is required")
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "volume_capability is required")
	}
	if why := validateCapability(req.GetVolumeCapability()); why != "" {
		return nil, status.Error(codes.InvalidArgument, why)
	}
	if err := s.p.mustKnow(id); err != nil {
		return nil, err
	}
	if r, ok := s.p.record(id); ok {
		if r.StagingPath != staging {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %q is staged at %s, not at %s", id, r.StagingPath, staging)
		}
		if s.p.opts.Stock {
			return &csi.NodeStageVolumeResponse{}, s.p.restoreStaging(ctx, r)
		}
		return &csi.NodeStageVolumeResponse{}, s.p.ensureHealthy(ctx, r)
	}
	if err := s.p.stage(ctx, &record{VolumeID: id, StagingPath: staging, VolumeContext: req.GetVolumeContext()}); err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// NodeUnstageVolume stops the volume's mounter and detaches what is left at the staging path.
// The staging folder stays: kubelet made it and removes it.
func (s *nodeServer) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case staging == "":
		return nil, status.Error(codes.InvalidArgument, "staging_target_path is required")
	}
	r, ok := s.p.record(id)
	if !ok {
		// Not staged: done already, unless the volume does not exist at all.
		if err := s.p.mustKnow(id); err != nil {
			return nil, err
		}
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	if r.StagingPath != staging {
		// Nothing of the volume is staged at that path.
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	if len(r.PublishTargets) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is still published at %s; unpublish it first", id, r.PublishTargets[0].Path)
	}
	if err := s.p.unstage(ctx, r); err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume bind-mounts the staging mount at the target, read-only when asked. A Stock
// driver first mounts a broken staging mount again, and replaces a broken mount at the target.
func (s *nodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	id, path, staging := req.GetVolumeId(), req.GetTargetPath(), req.GetStagingTargetPath()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case path == "":
		return nil, status.Error(codes.InvalidArgument, "target_path is required")
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "volume_capability is required")
	case staging == "":
		return nil, status.Error(codes.InvalidArgument, "staging_target_path is required: this driver stages volumes (STAGE_UNSTAGE_VOLUME)")
	}
	if why := validateCapability(req.GetVolumeCapability()); why != "" {
		return nil, status.Error(codes.InvalidArgument, why)
	}
	if err := s.p.mustKnow(id); err != nil {
		return nil, err
	}
	r, ok := s.p.record(id)
	if !ok || r.StagingPath != staging {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is not staged at %s", id, staging)
	}
	if s.p.opts.Stock {
		if err := s.p.restoreStaging(ctx, r); err != nil {
			return nil, err
		}
		// A new mounter is recorded.
		r, _ = s.p.record(id)
	}
	if err := s.p.publish(ctx, r, target{Path: path, ReadOnly: req.GetReadonly()}); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume detaches every mount stacked at the target (a healed target holds two)
// and removes the target folder, as the CSI spec asks.
func (s *nodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetTargetPath()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case path == "":
		return nil, status.Error(codes.InvalidArgument, "target_path is required")
	}
	r, ok := s.p.record(id)
	if ok {
		if _, published := r.target(path); published {
			if err := s.p.unpublish(ctx, r, path, true); err != nil {
				return nil, err
			}
			return &csi.NodeUnpublishVolumeResponse{}, nil
		}
	} else if err := s.p.mustKnow(id); err != nil {
		return nil, err
	}
	// Not published there. The folder goes when it is an empty one nobody else uses: a retry
	// after a plugin crash between the unmount and the removal finds it so.
	if _, owned := s.p.ownerOf(path); !owned {
		if dev, err := s.p.checker.MountDevice(path); err == nil && dev == "" {
			_ = os.Remove(path)
		}
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// NodeGetVolumeStats reports the usage of the file system at the volume's staging or publish
// path. A path whose mount is hung or dead is not stat'ed: the call would hang or fail; it
// answers INTERNAL with what the checks found, and NodeGetVolumeHealth says more.
func (s *nodeServer) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case path == "":
		return nil, status.Error(codes.InvalidArgument, "volume_path is required")
	}
	r, ok := s.p.record(id)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q is not staged on this node", id)
	}
	if _, published := r.target(path); !published && path != r.StagingPath {
		return nil, status.Errorf(codes.NotFound, "volume %q is neither staged nor published at %s", id, path)
	}
	findings, _ := s.p.checkMounts(ctx, r, path)
	if slices.ContainsFunc(findings, func(f driverkit.Finding) bool { return f.Status == csi.VolumeHealthErrorType_INACCESSIBLE }) {
		return nil, status.Errorf(codes.Internal, "volume %q at %s cannot be used: %s", id, path, findingsError(findings))
	}
	st, err := statfs(ctx, path, s.p.opts.StatTimeout)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "statfs %s: %v", path, err)
	}
	bsize := st.Bsize
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: int64(st.Blocks) * bsize, Available: int64(st.Bavail) * bsize, Used: int64(st.Blocks-st.Bfree) * bsize},
		{Unit: csi.VolumeUsage_INODES, Total: int64(st.Files), Available: int64(st.Ffree), Used: int64(st.Files - st.Ffree)},
	}}, nil
}

// NodeGetVolumeHealth reports what the kit's checks and the plugin's own find wrong with the
// volume's staging mount and its publish targets (only the one asked about, when the request
// names one), in the same vocabulary as the Healer's ProbeVolume.
func (s *nodeServer) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	r, ok := s.p.record(id)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q is not staged on this node", id)
	}
	if p := req.GetStagingTargetPath(); p != "" && p != r.StagingPath {
		return nil, status.Errorf(codes.NotFound, "volume %q is staged at %s, not at %s", id, r.StagingPath, p)
	}
	var findings []driverkit.Finding
	if p := req.GetVolumePublishPath(); p != "" {
		if _, published := r.target(p); !published {
			return nil, status.Errorf(codes.NotFound, "volume %q is not published at %s", id, p)
		}
		findings = append(findings, s.p.checker.Check(ctx, r.StagingPath, r.expect())...)
		more, _ := s.p.checkMounts(ctx, r, p)
		findings = append(findings, more...)
	} else {
		findings, _ = s.p.checkMounts(ctx, r, "")
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: &csi.VolumeHealth{
		VolumeId:       id,
		HealthStatuses: driverkit.Health(findings),
	}}, nil
}

// mustKnow answers NOT_FOUND for a volume CreateVolume did not create.
func (p *Plugin) mustKnow(id string) error {
	known, err := p.known(id)
	if err != nil {
		return status.Errorf(codes.Internal, "look up volume %q: %v", id, err)
	}
	if !known {
		return status.Errorf(codes.NotFound, "volume %q does not exist", id)
	}
	return nil
}

// stage records the volume, then starts its mounter: a plugin that dies in between leaves a
// record that the next NodeStageVolume or heal completes, never a mount nobody knows of. The
// caller holds the volume's lock.
func (p *Plugin) stage(ctx context.Context, r *record) error {
	log := klog.FromContext(ctx).WithValues("volume", r.VolumeID)
	if _, err := os.Stat(p.store.backing(r.VolumeID)); err != nil {
		return status.Errorf(codes.FailedPrecondition, "volume %q cannot be staged: its backing folder: %v", r.VolumeID, err)
	}
	if p.opts.Stock {
		if err := p.detachStrayStaging(ctx, r.VolumeID, r.StagingPath); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(r.StagingPath, 0o750); err != nil {
		return status.Errorf(codes.Internal, "create staging folder: %v", err)
	}
	r.FsName = p.fsName(r.VolumeID)
	r.Mounter = p.opts.Mounter
	if r.VolumeContext == nil {
		r.VolumeContext = map[string]string{}
	}
	if _, ok := r.VolumeContext[mounterKey]; !ok {
		r.VolumeContext[mounterKey] = mounterName
	}
	r.MounterPID = 0
	r.Supervised = p.sup != nil
	if err := p.saveRecord(r); err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	start := time.Now()
	pid, err := p.startMounter(ctx, r)
	if err != nil {
		if r.Supervised {
			// The supervisor let go of what it could not start; a Mount it did start is
			// asked back.
			_ = p.sup.Unmount(ctx, r.VolumeID)
		}
		_, _ = driverkit.UnmountAll(r.StagingPath)
		if derr := p.dropRecord(r.VolumeID); derr != nil {
			err = errors.Join(err, derr)
		}
		return status.Errorf(codes.Internal, "%v", err)
	}
	r.MounterPID = pid
	if err := p.saveRecord(r); err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	log.Info("Volume staged", "stagingPath", r.StagingPath, "mounterPID", pid, "supervised", r.Supervised, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// ensureHealthy repairs a staged volume whose mounts are broken, as HealVolume would. The
// caller holds the volume's lock.
func (p *Plugin) ensureHealthy(ctx context.Context, r *record) error {
	findings, healable := p.checkMounts(ctx, r, "")
	if len(findings) == 0 {
		return nil
	}
	if !healable {
		return status.Errorf(codes.FailedPrecondition, "volume %q cannot be repaired: %s", r.VolumeID, findingsError(findings))
	}
	res, err := p.repair(ctx, r)
	if err != nil {
		return status.Errorf(codes.Internal, "repair volume %q: %v", r.VolumeID, err)
	}
	if len(res.Findings) > 0 {
		return status.Errorf(codes.Internal, "volume %q is still broken after a repair: %s", r.VolumeID, findingsError(res.Findings))
	}
	klog.FromContext(ctx).Info("Volume repaired", "volume", r.VolumeID, "actions", res.Actions)
	return nil
}

// unstage stops the mounter, detaches what is left at the staging path and forgets the volume.
// The caller holds the volume's lock.
func (p *Plugin) unstage(ctx context.Context, r *record) error {
	if err := p.stopMounter(r, true); err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	n, err := driverkit.UnmountAll(r.StagingPath)
	if err != nil {
		return status.Errorf(codes.Internal, "unmount %s: %v", r.StagingPath, err)
	}
	if err := p.dropRecord(r.VolumeID); err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	klog.FromContext(ctx).Info("Volume unstaged", "volume", r.VolumeID, "stagingPath", r.StagingPath, "detached", n)
	return nil
}

// publish bind-mounts the staging mount at t. The target is recorded before it is mounted, so
// that no mount of the plugin is ever unknown to it. Publishing again where the volume is
// published already is a no-op, unless the bind is missing. The Healer driver stacks the bind on
// whatever the target shows; a Stock one detaches a mount there that is not the staging
// mount's first. The caller holds the volume's lock.
func (p *Plugin) publish(ctx context.Context, r *record, t target) error {
	if have, ok := r.target(t.Path); ok {
		if have.ReadOnly != t.ReadOnly {
			return status.Errorf(codes.AlreadyExists, "volume %q is published at %s with readonly=%t", r.VolumeID, t.Path, have.ReadOnly)
		}
		staged, _ := p.checker.MountDevice(r.StagingPath)
		published, _ := p.checker.MountDevice(t.Path)
		if staged != "" && staged == published {
			return nil
		}
	} else {
		if owner, owned := p.ownerOf(t.Path); owned {
			return status.Errorf(codes.FailedPrecondition, "%s is in use by volume %q", t.Path, owner)
		}
		next := r.clone()
		next.PublishTargets = append(next.PublishTargets, t)
		if err := p.saveRecord(next); err != nil {
			return status.Errorf(codes.Internal, "%v", err)
		}
		r = next
	}
	if p.opts.Stock {
		if err := p.replaceTargetMount(ctx, r, t.Path); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(t.Path, 0o750); err != nil {
		return status.Errorf(codes.Internal, "create target folder: %v", err)
	}
	if err := driverkit.BindMount(r.StagingPath, t.Path, t.ReadOnly); err != nil {
		if serr := p.saveRecord(r.withoutTarget(t.Path)); serr != nil {
			err = errors.Join(err, serr)
		}
		return status.Errorf(codes.Internal, "bind %s at %s: %v", r.StagingPath, t.Path, err)
	}
	klog.FromContext(ctx).Info("Volume published", "volume", r.VolumeID, "target", t.Path, "readOnly", t.ReadOnly)
	return nil
}

// unpublish detaches every mount at path and forgets the target; with removeDir it removes the
// target folder too, as NodeUnpublishVolume must. The caller holds the volume's lock.
func (p *Plugin) unpublish(ctx context.Context, r *record, path string, removeDir bool) error {
	if _, err := driverkit.UnmountAll(path); err != nil {
		return status.Errorf(codes.Internal, "unmount %s: %v", path, err)
	}
	if err := p.saveRecord(r.withoutTarget(path)); err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	if removeDir {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return status.Errorf(codes.Internal, "remove target folder: %v", err)
		}
	}
	klog.FromContext(ctx).Info("Volume unpublished", "volume", r.VolumeID, "target", path)
	return nil
}

// statfs stats the file system at path within timeout: a frozen mounter would hold the call.
func statfs(ctx context.Context, path string, timeout time.Duration) (unix.Statfs_t, error) {
	type answer struct {
		st  unix.Statfs_t
		err error
	}
	done := make(chan answer, 1)
	go func() {
		var a answer
		a.err = unix.Statfs(filepath.Clean(path), &a.st)
		done <- a
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case a := <-done:
		return a.st, a.err
	case <-timer.C:
		return unix.Statfs_t{}, errors.New("no answer within " + timeout.String())
	case <-ctx.Done():
		return unix.Statfs_t{}, ctx.Err()
	}
}
