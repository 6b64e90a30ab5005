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

// controllerServer implements the CSI Controller calls that create and delete volumes and
// publish them to nodes; the others answer UNIMPLEMENTED.
//
// Everything it knows lives in the state folder, so that it may run in another process than the
// Node service (a controller plugin beside external-provisioner and external-attacher, a node
// plugin beside kubelet) as long as both share the folder: one machine, one disk.
type controllerServer struct {
	csi.UnimplementedControllerServer
	p *Plugin
}

// ControllerGetCapabilities reports CREATE_DELETE_VOLUME and PUBLISH_UNPUBLISH_VOLUME. The
// second makes Kubernetes attach the volumes (external-attacher, VolumeAttachment objects),
// which is how volume-healer finds the volumes of a node.
func (s *controllerServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	resp := &csi.ControllerGetCapabilitiesResponse{}
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
	} {
		resp.Capabilities = append(resp.Capabilities, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
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
	known, err := s.p.known(id)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "look up volume %q: %v", id, err)
	}
	if !known {
		return &csi.DeleteVolumeResponse{}, nil
	}
	// The record on the disk, not only this process's: the node plugin that staged the volume
	// may be another process on the same state folder.
	r, staged := s.p.record(id)
	if !staged {
		if r, staged, err = s.p.store.readRecord(id); err != nil {
			return nil, status.Errorf(codes.Internal, "look up volume %q: %v", id, err)
		}
	}
	if staged {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is still staged at %s; unstage it first", id, r.StagingPath)
	}
	attached, err := s.p.store.attachments(id)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "look up the attachments of volume %q: %v", id, err)
	}
	if len(attached) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is still published to node %q; unpublish it first (ControllerUnpublishVolume)", id, attached[0].NodeID)
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

// ControllerPublishVolume records that the volume is published to the node. Nothing moves: the
// node plugin serves the volume from the shared state folder. Publishing again to the same node
// with the same read-only flag succeeds; with another flag it is ALREADY_EXISTS. A volume with a
// single-node access mode published to another node already is FAILED_PRECONDITION.
func (s *controllerServer) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	id, nodeID := req.GetVolumeId(), req.GetNodeId()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case nodeID == "":
		return nil, status.Error(codes.InvalidArgument, "node_id is required")
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "volume_capability is required")
	}
	if why := validateCapability(req.GetVolumeCapability()); why != "" {
		return nil, status.Error(codes.InvalidArgument, why)
	}
	s.p.createMu.Lock()
	defer s.p.createMu.Unlock()
	known, err := s.p.known(id)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "look up volume %q: %v", id, err)
	}
	if !known {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", id)
	}
	nodeKnown, err := s.p.store.nodeKnown(nodeID)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "look up node %q: %v", nodeID, err)
	}
	if !nodeKnown {
		return nil, status.Errorf(codes.NotFound, "node %q is unknown: no node plugin of this driver ran with --node-id %q on state folder %s",
			nodeID, nodeID, s.p.opts.StateDir)
	}
	attached, err := s.p.store.attachments(id)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "look up the attachments of volume %q: %v", id, err)
	}
	mode := req.GetVolumeCapability().GetAccessMode().GetMode()
	for _, a := range attached {
		if a.NodeID == nodeID {
			if a.ReadOnly != req.GetReadonly() {
				return nil, status.Errorf(codes.AlreadyExists, "volume %q is published to node %q with readonly=%t already", id, nodeID, a.ReadOnly)
			}
			return &csi.ControllerPublishVolumeResponse{}, nil
		}
		if singleNode(mode) || singleNode(a.AccessMode) {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %q is published to node %q already, and its access mode lets one node use it", id, a.NodeID)
		}
	}
	if err := s.p.store.saveAttachment(&attachment{VolumeID: id, NodeID: nodeID, ReadOnly: req.GetReadonly(), AccessMode: mode}); err != nil {
		return nil, status.Errorf(codes.Internal, "record the attachment of volume %q to node %q: %v", id, nodeID, err)
	}
	klog.FromContext(ctx).Info("Volume published to a node", "volume", id, "node", nodeID, "readOnly", req.GetReadonly())
	return &csi.ControllerPublishVolumeResponse{}, nil
}

// ControllerUnpublishVolume forgets that the volume is published to the node (to every node
// when node_id is empty). A volume or attachment that does not exist is unpublished already.
func (s *controllerServer) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	id, nodeID := req.GetVolumeId(), req.GetNodeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	s.p.createMu.Lock()
	defer s.p.createMu.Unlock()
	nodes := []string{nodeID}
	if nodeID == "" {
		attached, err := s.p.store.attachments(id)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "look up the attachments of volume %q: %v", id, err)
		}
		nodes = nodes[:0]
		for _, a := range attached {
			nodes = append(nodes, a.NodeID)
		}
	}
	for _, n := range nodes {
		found, err := s.p.store.removeAttachment(id, n)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "%v", err)
		}
		if found {
			klog.FromContext(ctx).Info("Volume unpublished from a node", "volume", id, "node", n)
		}
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// singleNode tells whether an access mode lets one node at a time use the volume.
func singleNode(m csi.VolumeCapability_AccessMode_Mode) bool {
	switch m {
	case csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER, csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER,
		csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
		return false
	default:
		return true
	}
}
