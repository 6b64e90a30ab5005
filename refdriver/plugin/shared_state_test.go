package plugin_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestControllerAndNodePluginsShareStateDir runs the plugin as a cluster does: one process
// serving the Controller calls (for external-provisioner and external-attacher) and another
// serving the Node calls (for kubelet), on one state folder. A volume one creates and publishes
// is staged, published, used and torn down through the other, and the first refuses to delete
// it while the second has it staged.
func TestControllerAndNodePluginsShareStateDir(t *testing.T) {
	e := newEnv(t)
	ctrl := e.startAs("c-", "controller-node")
	node := e.startAs("n-", "node-b")

	created, err := ctrl.controller.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "pvc-shared", VolumeCapabilities: []*csi.VolumeCapability{mountCapability}})
	if err != nil {
		t.Fatalf("CreateVolume through the controller plugin: %v", err)
	}
	id, volCtx := created.GetVolume().GetVolumeId(), created.GetVolume().GetVolumeContext()
	// The node plugin recorded its node ID when it started: the controller plugin publishes to it.
	if _, err := ctrl.controller.ControllerPublishVolume(ctx(t), &csi.ControllerPublishVolumeRequest{
		VolumeId: id, NodeId: "node-b", VolumeCapability: mountCapability, VolumeContext: volCtx,
	}); err != nil {
		t.Fatalf("ControllerPublishVolume to the node plugin's node: %v", err)
	}

	staging, target := e.stagingPath("pvc-shared"), e.targetPath("pod-shared", "pvc-shared")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := node.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCapability, VolumeContext: volCtx,
	}); err != nil {
		t.Fatalf("NodeStageVolume through the node plugin of a volume the controller plugin created: %v", err)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := node.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCapability, VolumeContext: volCtx,
	}); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	if err := writeRead(target, "shared", "written through the node plugin"); err != nil {
		t.Errorf("use the volume: %v", err)
	}

	if _, err := ctrl.controller.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("DeleteVolume through the controller plugin while the node plugin has the volume staged: %v, want FAILED_PRECONDITION", err)
	}

	if _, err := node.node.NodeUnpublishVolume(ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Errorf("NodeUnpublishVolume: %v", err)
	}
	if _, err := node.node.NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Errorf("NodeUnstageVolume: %v", err)
	}
	if _, err := ctrl.controller.ControllerUnpublishVolume(ctx(t), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-b"}); err != nil {
		t.Errorf("ControllerUnpublishVolume: %v", err)
	}
	if _, err := ctrl.controller.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Errorf("DeleteVolume once unstaged and unpublished: %v", err)
	}
	// The node plugin sees the deletion too.
	if _, err := node.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCapability, VolumeContext: volCtx,
	}); status.Code(err) != codes.NotFound {
		t.Errorf("NodeStageVolume of the deleted volume: %v, want NOT_FOUND", err)
	}
	e.expectNothingLeft()
}
