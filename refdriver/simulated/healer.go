package simulated

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/klog/v2"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/refdriver/control"
)

// healerServer implements the Healer service. ProbeVolume and HealVolume make their checks in
// the order below, and each failed check has its own gRPC code (docs/protocol.md):
//
//  1. the RPC is advertised in GetHealerCapabilities    else UNIMPLEMENTED
//  2. volume_id is set                                   else INVALID_ARGUMENT
//  3. the driver knows the volume                        else NOT_FOUND
//  4. no other call holds the volume's lock              else ABORTED
//  5. the volume is staged here (at the path given)      else FAILED_PRECONDITION
//  6. HealVolume only: the volume can be healed          else FAILED_PRECONDITION
//
// Only then does the call touch the mount, which is where a hung mounter blocks it.
type healerServer struct {
	healerv1alpha1.UnimplementedHealerServer
	d *Driver
}

// GetHealerCapabilities advertises the RPCs this driver serves, the restarts its kept volumes
// live through, and the attribute "healMounters", which a policy can read to decide which
// volumes are worth a heal.
func (s *healerServer) GetHealerCapabilities(context.Context, *healerv1alpha1.GetHealerCapabilitiesRequest) (*healerv1alpha1.GetHealerCapabilitiesResponse, error) {
	s.d.counters.Count("GetHealerCapabilities")
	resp := &healerv1alpha1.GetHealerCapabilitiesResponse{
		Attributes: map[string]string{"healMounters": strings.Join(s.d.opts.HealMounters, ",")},
	}
	for _, t := range s.d.opts.Capabilities {
		resp.Capabilities = append(resp.Capabilities, healerv1alpha1.NewRPCCapability(t))
	}
	for _, t := range s.d.opts.VolumeKeeping {
		resp.Capabilities = append(resp.Capabilities, healerv1alpha1.NewVolumeKeepingCapability(t))
	}
	return resp, nil
}

// ProbeVolume reports the health of a volume without changing it, and whether the driver keeps
// it alive across restarts (its mounter is one the driver keeps). A kept volume can still be
// broken on purpose: it then reports its condition and is healed like any other.
func (s *healerServer) ProbeVolume(ctx context.Context, req *healerv1alpha1.ProbeVolumeRequest) (*healerv1alpha1.ProbeVolumeResponse, error) {
	v, release, err := s.begin(ctx, "ProbeVolume", healerv1alpha1.HealerCapability_RPC_PROBE, req.GetVolumeId(), req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	defer release()

	v, err = s.touchMount(ctx, v)
	if err != nil {
		return nil, err
	}
	return &healerv1alpha1.ProbeVolumeResponse{
		HealthStatuses: health(v),
		Healable:       s.d.Healable(v),
		RecheckAfter:   recheckAfter(v),
		Kept:           s.d.Kept(v),
	}, nil
}

// HealVolume repairs a volume and reports the health that remains. Healing a healthy volume
// changes nothing; a lost volume cannot be repaired, and the answer says so with its DATA_LOSS
// health rather than with an error, because the heal itself ran.
func (s *healerServer) HealVolume(ctx context.Context, req *healerv1alpha1.HealVolumeRequest) (*healerv1alpha1.HealVolumeResponse, error) {
	v, release, err := s.begin(ctx, "HealVolume", healerv1alpha1.HealerCapability_RPC_HEAL, req.GetVolumeId(), req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	defer release()

	if !s.d.Healable(v) {
		return nil, status.Errorf(codes.FailedPrecondition,
			"volume %q is mounted with %q, which this driver cannot heal (it heals %s)",
			v.ID, v.VolumeContext[MounterKey], strings.Join(s.d.opts.HealMounters, ", "))
	}
	v, err = s.touchMount(ctx, v)
	if err != nil {
		return nil, err
	}
	log := klog.FromContext(ctx).WithValues("volume", v.ID)
	switch v.Condition {
	case control.Healthy:
		log.V(2).Info("Heal found the volume healthy")
	case control.Lost:
		log.Info("Heal cannot repair a volume whose data is lost")
	default:
		id, before := v.ID, v.Condition
		// A real driver restarts the mounter and mounts the volume again here.
		v, err = s.d.update(id, func(v *Volume) { v.Condition, v.Hang = control.Healthy, 0 })
		if err != nil {
			return nil, status.Errorf(codes.Internal, "record heal of volume %q: %v", id, err)
		}
		log.Info("Volume healed", "was", before)
	}
	return &healerv1alpha1.HealVolumeResponse{
		HealthStatuses: health(v),
		RecheckAfter:   recheckAfter(v),
	}, nil
}

// ListStagedVolumes pages through the staged volumes in volume ID order. The token names the
// first volume of the next page, so that volumes added or removed between two pages neither
// repeat nor shift the others.
func (s *healerServer) ListStagedVolumes(_ context.Context, req *healerv1alpha1.ListStagedVolumesRequest) (*healerv1alpha1.ListStagedVolumesResponse, error) {
	s.d.counters.Count("ListStagedVolumes")
	if !s.d.serves(healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES) {
		return nil, status.Error(codes.Unimplemented, "this driver does not advertise LIST_VOLUMES")
	}
	if req.GetMaxEntries() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "max_entries must not be negative, got %d", req.GetMaxEntries())
	}
	from := ""
	if tok := req.GetStartingToken(); tok != "" {
		var ok bool
		if from, ok = decodeToken(tok); !ok {
			return nil, status.Errorf(codes.Aborted, "starting_token %q was not issued by this driver; start the listing again", tok)
		}
	}

	var staged []Volume
	for _, v := range s.d.Volumes() {
		if v.Staged && v.ID >= from {
			staged = append(staged, v)
		}
	}
	resp := &healerv1alpha1.ListStagedVolumesResponse{}
	if limit := int(req.GetMaxEntries()); limit > 0 && len(staged) > limit {
		resp.NextToken = encodeToken(staged[limit].ID)
		staged = staged[:limit]
	}
	for _, v := range staged {
		resp.Entries = append(resp.Entries, &healerv1alpha1.ListStagedVolumesResponse_Entry{
			VolumeId:           v.ID,
			StagingTargetPath:  v.StagingTargetPath,
			PublishTargetPaths: slices.Clone(v.PublishTargetPaths),
			VolumeContext:      v.VolumeContext,
		})
	}
	return resp, nil
}

// begin makes checks 1 to 5 for a volume RPC and returns the volume with its lock held;
// release unlocks it and ends the call's in-flight count.
func (s *healerServer) begin(ctx context.Context, rpc string, capability healerv1alpha1.HealerCapability_RPC_Type, volumeID, stagingPath string) (v Volume, release func(), err error) {
	s.d.counters.Count(rpc)
	if !s.d.serves(capability) {
		return Volume{}, nil, status.Errorf(codes.Unimplemented, "this driver does not advertise %s", capability)
	}
	if volumeID == "" {
		return Volume{}, nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	leave := s.d.counters.Enter(ctx, rpc, volumeID)

	v, err = s.d.Volume(volumeID)
	if err != nil {
		leave()
		return Volume{}, nil, status.Errorf(codes.NotFound, "volume %q is not known to this driver", volumeID)
	}
	unlock, ok := s.d.tryLock(volumeID)
	if !ok {
		s.d.counters.Aborted(volumeID)
		leave()
		return Volume{}, nil, status.Errorf(codes.Aborted, "an operation on volume %q is in flight; retry later", volumeID)
	}
	release = func() {
		unlock()
		leave()
	}
	switch {
	case !v.Staged:
		release()
		return Volume{}, nil, status.Errorf(codes.FailedPrecondition, "volume %q is not staged on this node", volumeID)
	case stagingPath != "" && stagingPath != v.StagingTargetPath:
		release()
		return Volume{}, nil, status.Errorf(codes.FailedPrecondition,
			"volume %q is staged at %s, not at %s", volumeID, v.StagingTargetPath, stagingPath)
	}
	return v, release, nil
}

// touchMount is where a real driver stats the staging path, reads from it, or asks its mounter
// daemon. On a hung volume that blocks: here for the volume's hang duration, or until the
// caller gives up. It returns the volume as it is after the wait, since the control interface
// may have changed it meanwhile.
func (s *healerServer) touchMount(ctx context.Context, v Volume) (Volume, error) {
	if v.Condition != control.Hung {
		return v, nil
	}
	select {
	case <-ctx.Done():
		return Volume{}, status.FromContextError(ctx.Err()).Err()
	case <-s.d.opts.Clock.After(time.Duration(v.Hang)):
	}
	id := v.ID
	v, err := s.d.Volume(id)
	if errors.Is(err, control.ErrVolumeNotFound) {
		return Volume{}, status.Errorf(codes.NotFound, "volume %q was removed during the call", id)
	}
	return v, err
}

// health translates a condition into the CSI VolumeHealth vocabulary. Reasons are CamelCase and
// stable, for machines; messages are for people.
func health(v Volume) []*csi.VolumeHealth_VolumeHealthEntry {
	entry := func(t csi.VolumeHealthErrorType, reason, msg string) []*csi.VolumeHealth_VolumeHealthEntry {
		return []*csi.VolumeHealth_VolumeHealthEntry{{Status: t, Reason: reason, Message: msg}}
	}
	switch v.Condition {
	case control.Gone:
		return entry(csi.VolumeHealthErrorType_INACCESSIBLE, "MountGone",
			fmt.Sprintf("nothing is mounted at %s: the mounter is gone", v.StagingTargetPath))
	case control.ReadOnly:
		return entry(csi.VolumeHealthErrorType_DEGRADED, "ReadOnlyMount",
			fmt.Sprintf("%s is mounted read-only after I/O errors", v.StagingTargetPath))
	case control.Hung:
		return entry(csi.VolumeHealthErrorType_INACCESSIBLE, "MountHung",
			fmt.Sprintf("the mount at %s took %s to answer", v.StagingTargetPath, time.Duration(v.Hang)))
	case control.Lost:
		return entry(csi.VolumeHealthErrorType_DATA_LOSS, "DataLoss",
			fmt.Sprintf("the data of volume %s is lost; restore it from a snapshot or backup", v.ID))
	}
	return nil
}

func recheckAfter(v Volume) *durationpb.Duration {
	if v.RecheckAfter <= 0 {
		return nil
	}
	return durationpb.New(time.Duration(v.RecheckAfter))
}

// tokenPrefix versions the page token so that a token from elsewhere is recognised as invalid.
const tokenPrefix = "staged/v1/"

func encodeToken(nextID string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(tokenPrefix + nextID))
}

func decodeToken(tok string) (nextID string, ok bool) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return "", false
	}
	return strings.CutPrefix(string(b), tokenPrefix)
}
