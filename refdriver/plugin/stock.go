package plugin

import (
	"context"
	"slices"

	"github.com/csi-addons/spec/lib/go/identity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/driverkit"
)

// The stock mode (Options.Stock): the plugin behaves as a CSI driver that knows nothing of
// volume-healer, so that volume-healer's generic path (the sidecar's own probe, recycling) is
// tested against the behaviour of the drivers operators run. What it does differently:
//   - the CSI-Addons socket carries the CSI-Addons Identity only (as ceph-csi serves it for its
//     own CSI-Addons services), without the Healer protocol in its manifest; Healer calls
//     answer UNIMPLEMENTED;
//   - NodeStageVolume repairs a broken staging mount (restoreStaging);
//   - NodePublishVolume restores a broken staging mount first, then replaces a broken mount at
//     its target (publish), the fuse recovery ceph-csi's CephFS NodePublishVolume does;
//   - with Options.UnmountDeadTargetsOnStart, New detaches the dead publish targets.
// The checks and the repair are driverkit's, as in the Healer mode.

// registerStockAddons adds the CSI-Addons Identity of a stock driver to s.
func (p *Plugin) registerStockAddons(s grpc.ServiceRegistrar) {
	identity.RegisterIdentityServer(s, &stockIdentityServer{p: p})
}

// stockIdentityServer is the CSI-Addons Identity of a driver that serves no Healer service:
// its manifest names the node only.
type stockIdentityServer struct {
	identity.UnimplementedIdentityServer
	p *Plugin
}

// GetIdentity reports the driver's name and version, and its node in the manifest.
func (s *stockIdentityServer) GetIdentity(context.Context, *identity.GetIdentityRequest) (*identity.GetIdentityResponse, error) {
	return &identity.GetIdentityResponse{
		Name:          s.p.opts.DriverName,
		VendorVersion: s.p.opts.VendorVersion,
		Manifest:      map[string]string{"nodeID": s.p.opts.NodeID},
	}, nil
}

// GetCapabilities reports the node service.
func (s *stockIdentityServer) GetCapabilities(context.Context, *identity.GetCapabilitiesRequest) (*identity.GetCapabilitiesResponse, error) {
	return &identity.GetCapabilitiesResponse{Capabilities: []*identity.Capability{{
		Type: &identity.Capability_Service_{Service: &identity.Capability_Service{Type: identity.Capability_Service_NODE_SERVICE}},
	}}}, nil
}

// Probe reports ready: the state is loaded before the plugin listens.
func (s *stockIdentityServer) Probe(context.Context, *identity.ProbeRequest) (*identity.ProbeResponse, error) {
	return &identity.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

// restoreStaging repairs the volume's staging mount when it is broken (dead, hung, gone, wrong
// or read-only): the broken mount is detached and the mounter started again, through the kit's
// repair with no publish target, since a stock driver leaves the mounts of running pods alone.
// A healthy staging mount is left as it is. The caller holds the volume's lock.
func (p *Plugin) restoreStaging(ctx context.Context, r *record) error {
	findings := p.checker.Check(ctx, r.StagingPath, r.expect())
	if len(findings) == 0 {
		return nil
	}
	own, healable := p.Inspect(ctx, r.kitVolume())
	if !healable {
		return status.Errorf(codes.FailedPrecondition, "volume %q cannot be mounted again: %s", r.VolumeID, findingsError(append(findings, own...)))
	}
	v := r.kitVolume()
	res, err := p.checker.Repair(ctx, driverkit.Repair{
		VolumeID:    v.ID,
		StagingPath: v.StagingPath,
		Expect:      v.Expect,
		Remount:     func(ctx context.Context) error { return p.Remount(ctx, v) },
	})
	// Pods that still see the dead mount are not this call's business: a stock driver does not
	// look for them.
	still := slices.DeleteFunc(res.Findings, func(f driverkit.Finding) bool { return f.Reason == driverkit.ReasonStaleMountInPods })
	if err != nil {
		return status.Errorf(codes.Internal, "mount volume %q again at %s: %v", r.VolumeID, r.StagingPath, err)
	}
	if len(still) > 0 {
		return status.Errorf(codes.Internal, "volume %q is still broken at %s after it was mounted again: %s", r.VolumeID, r.StagingPath, findingsError(still))
	}
	klog.FromContext(ctx).Info("Broken staging mount replaced", "volume", r.VolumeID, "stagingPath", r.StagingPath,
		"found", findingsError(findings), "actions", res.Actions)
	return nil
}

// replaceTargetMount detaches whatever is mounted at a publish target that does not show the
// staging mount (a dead or hung mount of an earlier mounter, typically), so that the bind that
// follows replaces it instead of stacking on it. It reads only the mount table: a stat of a hung
// target would block. The caller holds the volume's lock.
func (p *Plugin) replaceTargetMount(ctx context.Context, r *record, path string) error {
	published, err := p.checker.MountDevice(path)
	if err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	if published == "" {
		return nil
	}
	if staged, _ := p.checker.MountDevice(r.StagingPath); staged == published {
		return nil
	}
	n, err := driverkit.UnmountAll(path)
	if err != nil {
		return status.Errorf(codes.Internal, "detach the broken mount at target %s: %v", path, err)
	}
	klog.FromContext(ctx).Info("Broken mount at the publish target detached", "volume", r.VolumeID, "target", path, "device", published, "detached", n)
	return nil
}

// detachStrayStaging detaches what is mounted at the staging path of a volume this plugin has
// no record of: nobody serves it (a mounter of a forgotten staging, dead most likely), and a
// stat of it could fail or block. The caller holds the volume's lock.
func (p *Plugin) detachStrayStaging(ctx context.Context, id, staging string) error {
	dev, err := p.checker.MountDevice(staging)
	if err != nil || dev == "" {
		return err
	}
	n, err := driverkit.UnmountAll(staging)
	if err != nil {
		return status.Errorf(codes.Internal, "detach the mount left at staging path %s: %v", staging, err)
	}
	klog.FromContext(ctx).Info("Mount left at the staging path detached", "volume", id, "stagingPath", staging, "device", dev, "detached", n)
	return nil
}

// unmountDeadTargets is the start-up clean-up of Options.UnmountDeadTargetsOnStart: every
// recorded publish target whose mount is dead or hung is detached, every layer; its folder and
// the record stay, so kubelet and the plugin still count it published while it is an empty
// folder on the node's disk.
func (p *Plugin) unmountDeadTargets(ctx context.Context) {
	log := p.opts.Logger
	for _, r := range p.recordList() {
		for _, t := range r.PublishTargets {
			findings := p.checker.Check(ctx, t.Path, r.expect())
			if !slices.ContainsFunc(findings, func(f driverkit.Finding) bool {
				return f.Reason == driverkit.ReasonMountDisconnected || f.Reason == driverkit.ReasonMountHung
			}) {
				continue
			}
			n, err := driverkit.UnmountAll(t.Path)
			if err != nil {
				log.Error(err, "Start-up clean-up could not detach a dead publish target", "volume", r.VolumeID, "target", t.Path)
				continue
			}
			log.Info("Start-up clean-up detached a dead publish target; its folder stays, empty, and kubelet still counts it published",
				"volume", r.VolumeID, "target", t.Path, "detached", n, "found", findingsError(findings))
		}
	}
}
