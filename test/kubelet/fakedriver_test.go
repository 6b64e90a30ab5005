package kubelet_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/volume-healer/volume-healer/test/kubelet"
)

// fakeNode is a CSI Node service that really mounts: a tmpfs at the staging path on
// NodeStageVolume (at the publish path if it does not stage), a bind of the staging path at the
// publish path on NodePublishVolume. It checks what a driver may expect of kubelet: the staging
// folder exists, the publish path's parent exists and the publish path itself does not.
type fakeNode struct {
	csi.UnimplementedNodeServer
	stages bool

	mu        sync.Mutex
	staged    []*csi.NodeStageVolumeRequest
	published []*csi.NodePublishVolumeRequest
}

// serveFakeNode serves a fakeNode on a UNIX socket until the test ends and returns a connection
// to it made with kubelet.Dial.
func serveFakeNode(t *testing.T, stages bool) (*fakeNode, *grpc.ClientConn) {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "csi.sock")
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{stages: stages}
	srv := grpc.NewServer()
	csi.RegisterNodeServer(srv, n)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	conn, err := kubelet.Dial(testContext(t), "unix://"+socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return n, conn
}

func (n *fakeNode) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	resp := &csi.NodeGetCapabilitiesResponse{}
	if n.stages {
		resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME}},
		})
	}
	return resp, nil
}

func (n *fakeNode) NodeStageVolume(_ context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	n.mu.Lock()
	n.staged = append(n.staged, req)
	n.mu.Unlock()
	path := req.GetStagingTargetPath()
	if fi, err := os.Stat(path); err != nil || !fi.IsDir() {
		return nil, status.Errorf(codes.FailedPrecondition, "staging path %s: want a folder made by kubelet: %v", path, err)
	}
	if err := mountOnce("tmpfs", path, "tmpfs", 0); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

func (n *fakeNode) NodeUnstageVolume(_ context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if err := unmountIfMounted(req.GetStagingTargetPath()); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

func (n *fakeNode) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	n.mu.Lock()
	n.published = append(n.published, req)
	n.mu.Unlock()
	target := req.GetTargetPath()
	if _, err := os.Stat(filepath.Dir(target)); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "the parent of the publish path: want a folder made by kubelet: %v", err)
	}
	// The CSI spec leaves the publish path to the driver; kubelet does not make it.
	if err := os.Mkdir(target, 0o750); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	var err error
	if n.stages {
		err = mountOnce(req.GetStagingTargetPath(), target, "", syscall.MS_BIND)
	} else {
		err = mountOnce("tmpfs", target, "tmpfs", 0)
	}
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (n *fakeNode) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	target := req.GetTargetPath()
	if err := unmountIfMounted(target); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func (n *fakeNode) requests() ([]*csi.NodeStageVolumeRequest, []*csi.NodePublishVolumeRequest) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]*csi.NodeStageVolumeRequest(nil), n.staged...), append([]*csi.NodePublishVolumeRequest(nil), n.published...)
}

// mountOnce mounts source at path unless something is mounted there already, as an idempotent
// CSI call must.
func mountOnce(source, path, fstype string, flags uintptr) error {
	mounted, err := mountinfo.Mounted(path)
	if err != nil || mounted {
		return err
	}
	return syscall.Mount(source, path, fstype, flags, "size=4m")
}

func unmountIfMounted(path string) error {
	mounted, err := mountinfo.Mounted(path)
	if errors.Is(err, os.ErrNotExist) || err == nil && !mounted {
		return nil
	}
	if err != nil {
		return err
	}
	return syscall.Unmount(path, 0)
}
