package plugin

import (
	"context"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/volume-healer/volume-healer/refdriver/control"
)

func capabilityWith(m csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: m},
	}
}

// newControllerPlugin is a plugin on stateDir playing nodeID, for the Controller calls, which
// mount nothing.
func newControllerPlugin(t *testing.T, stateDir, nodeID string) *controllerServer {
	t.Helper()
	p, err := New(Options{StateDir: stateDir, Identity: control.Identity{NodeID: nodeID}, MounterCommand: []string{"/bin/false"}})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &controllerServer{p: p}
}

func TestControllerPublishVolume(t *testing.T) {
	swr := capabilityWith(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	mnmw := capabilityWith(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	type publish struct {
		node     string
		cap      *csi.VolumeCapability
		readOnly bool
		want     codes.Code
	}
	tests := map[string]struct {
		volume   string // "" for the volume the test created
		cap      *csi.VolumeCapability
		publish  []publish
		wantNode []string
	}{
		"a volume published to a node is recorded": {
			publish:  []publish{{node: "node-a", cap: swr, want: codes.OK}},
			wantNode: []string{"node-a"},
		},
		"publishing again the same way is a no-op": {
			publish:  []publish{{node: "node-a", cap: swr, want: codes.OK}, {node: "node-a", cap: swr, want: codes.OK}},
			wantNode: []string{"node-a"},
		},
		"publishing again with another read-only flag is ALREADY_EXISTS": {
			publish:  []publish{{node: "node-a", cap: swr, want: codes.OK}, {node: "node-a", cap: swr, readOnly: true, want: codes.AlreadyExists}},
			wantNode: []string{"node-a"},
		},
		"a single-node volume published to a second node is FAILED_PRECONDITION": {
			publish:  []publish{{node: "node-a", cap: swr, want: codes.OK}, {node: "node-b", cap: swr, want: codes.FailedPrecondition}},
			wantNode: []string{"node-a"},
		},
		"a multi-node volume is published to two nodes": {
			publish:  []publish{{node: "node-a", cap: mnmw, want: codes.OK}, {node: "node-b", cap: mnmw, want: codes.OK}},
			wantNode: []string{"node-a", "node-b"},
		},
		"a node no plugin played is NOT_FOUND": {
			publish: []publish{{node: "node-x", cap: swr, want: codes.NotFound}},
		},
		"a volume that does not exist is NOT_FOUND": {
			volume:  "vol-000000000000000000000000",
			publish: []publish{{node: "node-a", cap: swr, want: codes.NotFound}},
		},
		"no node ID is INVALID_ARGUMENT": {
			publish: []publish{{node: "", cap: swr, want: codes.InvalidArgument}},
		},
		"no capability is INVALID_ARGUMENT": {
			publish: []publish{{node: "node-a", want: codes.InvalidArgument}},
		},
		"a block capability is INVALID_ARGUMENT": {
			publish: []publish{{node: "node-a", cap: &csi.VolumeCapability{
				AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
			}, want: codes.InvalidArgument}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			// Two node plugins ran on the folder; the controller plays a third name.
			newControllerPlugin(t, dir, "node-a")
			newControllerPlugin(t, dir, "node-b")
			s := newControllerPlugin(t, dir, "controller")
			ctx := context.Background()
			created, err := s.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{swr}})
			if err != nil {
				t.Fatalf("CreateVolume: %v", err)
			}
			id := created.GetVolume().GetVolumeId()
			if tc.volume != "" {
				id = tc.volume
			}
			for i, pub := range tc.publish {
				_, err := s.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{
					VolumeId: id, NodeId: pub.node, VolumeCapability: pub.cap, Readonly: pub.readOnly,
				})
				if got := status.Code(err); got != pub.want {
					t.Errorf("publish %d to %q: %v, want %s", i, pub.node, err, pub.want)
				}
			}
			attached, err := s.p.store.attachments(id)
			if err != nil {
				t.Fatal(err)
			}
			var nodes []string
			for _, a := range attached {
				nodes = append(nodes, a.NodeID)
			}
			if !slices.Equal(nodes, tc.wantNode) {
				t.Errorf("published to %q, want %q", nodes, tc.wantNode)
			}
		})
	}
}

func TestControllerUnpublishAndDelete(t *testing.T) {
	dir := t.TempDir()
	newControllerPlugin(t, dir, "node-a")
	s := newControllerPlugin(t, dir, "controller")
	ctx := context.Background()
	swr := capabilityWith(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	created, err := s.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{swr}})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	id := created.GetVolume().GetVolumeId()
	if _, err := s.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-a", VolumeCapability: swr}); err != nil {
		t.Fatalf("ControllerPublishVolume: %v", err)
	}
	if _, err := s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("DeleteVolume of a published volume: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := s.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("ControllerUnpublishVolume without a volume ID: %v, want INVALID_ARGUMENT", err)
	}
	for i := range 2 { // the second is a retry, and succeeds as well
		if _, err := s.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-a"}); err != nil {
			t.Errorf("ControllerUnpublishVolume %d: %v", i, err)
		}
	}
	if attached, _ := s.p.store.attachments(id); len(attached) > 0 {
		t.Errorf("still published to %q after the unpublish", attached[0].NodeID)
	}
	// A node ID left out unpublishes from every node.
	if _, err := s.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-a", VolumeCapability: swr}); err != nil {
		t.Fatalf("ControllerPublishVolume: %v", err)
	}
	if _, err := s.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id}); err != nil {
		t.Errorf("ControllerUnpublishVolume without a node: %v", err)
	}
	if _, err := s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Errorf("DeleteVolume after the unpublish: %v", err)
	}
	if _, err := s.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-a"}); err != nil {
		t.Errorf("ControllerUnpublishVolume of a deleted volume: %v, want success", err)
	}
}

// TestDeleteVolumeSeesAnotherPluginsStaging checks that a plugin serving the Controller calls
// refuses to delete a volume another plugin on the same state folder staged.
func TestDeleteVolumeSeesAnotherPluginsStaging(t *testing.T) {
	dir := t.TempDir()
	s := newControllerPlugin(t, dir, "controller")
	node := newControllerPlugin(t, dir, "node-a").p
	ctx := context.Background()
	created, err := s.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-1",
		VolumeCapabilities: []*csi.VolumeCapability{capabilityWith(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	id := created.GetVolume().GetVolumeId()
	// What the node plugin's NodeStageVolume records before it starts the mounter.
	if err := node.saveRecord(&record{VolumeID: id, StagingPath: "/var/lib/kubelet/plugins/kubernetes.io/csi/x/globalmount", FsName: "x"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("DeleteVolume of a volume the other plugin staged: %v, want FAILED_PRECONDITION", err)
	}
	if known, _ := s.p.known(id); !known {
		t.Error("the staged volume was deleted")
	}
}
