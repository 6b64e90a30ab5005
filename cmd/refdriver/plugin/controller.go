package plugin

import (
	"context"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// defaultCapacity is the size of a volume created without a capacity range. Sizes are recorded
// and reported, not enforced: a volume is a folder on the plugin's disk.
const defaultCapacity = 1 << 30

// controllerServer implements the CSI Controller calls that create and delete volumes; the
// others answer UNIMPLEMENTED.
type controllerServer struct {
	csi.UnimplementedControllerServer
	p *Plugin
}

// ControllerGetCapabilities reports CREATE_DELETE_VOLUME.
func (s *controllerServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{
		Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}},
	}}}, nil
}

// CreateVolume creates the volume's backing folder. Its ID is derived from its name, so a
// retry finds the volume the first attempt created; a retry asking for a capacity the volume
// does not have is ALREADY_EXISTS.
func (s *controllerServer) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if why := validateCapabilities(req.GetVolumeCapabilities()); why != "" {
		return nil, status.Error(codes.InvalidArgument, why)
	}
	if req.GetVolumeContentSource() != nil {
		return nil, status.Error(codes.InvalidArgument, "volume_content_source is not supported: this driver creates empty volumes only")
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	if required < 0 || limit < 0 || (limit > 0 && required > limit) {
		return nil, status.Errorf(codes.OutOfRange, "capacity range required_bytes=%d limit_bytes=%d cannot be met", required, limit)
	}
	capacity := required
	if capacity == 0 {
		capacity = defaultCapacity
		if limit > 0 && limit < capacity {
			capacity = limit
		}
	}

	s.p.createMu.Lock()
	defer s.p.createMu.Unlock()
	id := volumeIDFor(req.GetName())
	m, found, err := s.p.store.meta(id)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "look up volume %q: %v", id, err)
	}
	if found {
		if m.CapacityBytes < required || (limit > 0 && m.CapacityBytes > limit) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists as %s with %d bytes, outside the requested range [%d, %d]",
				req.GetName(), id, m.CapacityBytes, required, limit)
		}
		capacity = m.CapacityBytes
	} else {
		if err := os.MkdirAll(s.p.store.backing(id), 0o777); err != nil {
			return nil, status.Errorf(codes.Internal, "create the backing folder of volume %q: %v", id, err)
		}
		// The folder is made first, so that a described volume always has its data.
		if err := s.p.store.saveMeta(&volumeMeta{ID: id, Name: req.GetName(), CapacityBytes: capacity}); err != nil {
			return nil, status.Errorf(codes.Internal, "record volume %q: %v", id, err)
		}
		klog.FromContext(ctx).Info("Volume created", "volume", id, "name", req.GetName(), "capacityBytes", capacity)
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{
		VolumeId:      id,
		CapacityBytes: capacity,
		VolumeContext: map[string]string{mounterKey: mounterName},
	}}, nil
}

// DeleteVolume removes the volume and its data. An unknown volume is already deleted; a volume
// still staged on this node is FAILED_PRECONDITION, since its mounter serves that data.
func (s *controllerServer) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	s.p.createMu.Lock()
	defer s.p.createMu.Unlock()
	if r, ok := s.p.record(id); ok {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is still staged at %s; unstage it first", id, r.StagingPath)
	}
	known, err := s.p.known(id)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "look up volume %q: %v", id, err)
	}
	if !known {
		return &csi.DeleteVolumeResponse{}, nil
	}
	if err := s.p.store.deleteVolume(id); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	klog.FromContext(ctx).Info("Volume deleted", "volume", id)
	return &csi.DeleteVolumeResponse{}, nil
}

// ValidateVolumeCapabilities confirms the capabilities the plugin serves.
func (s *controllerServer) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume_capabilities is required")
	}
	known, err := s.p.known(id)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "look up volume %q: %v", id, err)
	}
	if !known {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", id)
	}
	if why := validateCapabilities(req.GetVolumeCapabilities()); why != "" {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: why}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}
