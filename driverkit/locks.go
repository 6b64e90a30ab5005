package driverkit

import (
	"context"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Locks keeps one operation per volume at a time, across the Healer calls and the driver's own
// CSI Node calls: a call that finds its volume busy is answered ABORTED at once instead of queueing
// (the protocol's rule, which keeps a heal from racing kubelet). The zero value is ready to use and
// safe for concurrent use.
type Locks struct {
	mu   sync.Mutex
	held map[string]struct{}
}

// TryLock takes the lock of volumeID. ok is false when another operation holds it; otherwise
// unlock releases it (calling it twice is harmless).
func (l *Locks) TryLock(volumeID string) (unlock func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, busy := l.held[volumeID]; busy {
		return func() {}, false
	}
	if l.held == nil {
		l.held = make(map[string]struct{})
	}
	l.held[volumeID] = struct{}{}
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			delete(l.held, volumeID)
		})
	}, true
}

// Lock is TryLock for gRPC handlers: it returns the gRPC status ABORTED, naming the volume, when
// the volume is busy.
func (l *Locks) Lock(volumeID string) (unlock func(), err error) {
	unlock, ok := l.TryLock(volumeID)
	if !ok {
		return unlock, status.Errorf(codes.Aborted, "an operation on volume %q is already in progress", volumeID)
	}
	return unlock, nil
}

// lockedNodeMethods are the CSI Node calls that change a volume's mounts; the protocol keeps
// them from running next to a probe or heal of the same volume.
var lockedNodeMethods = map[string]bool{
	csi.Node_NodeStageVolume_FullMethodName:     true,
	csi.Node_NodeUnstageVolume_FullMethodName:   true,
	csi.Node_NodePublishVolume_FullMethodName:   true,
	csi.Node_NodeUnpublishVolume_FullMethodName: true,
	csi.Node_NodeExpandVolume_FullMethodName:    true,
}

// UnaryServerInterceptor takes the volume's lock around the CSI Node calls that change a volume's
// mounts (NodeStageVolume, NodeUnstageVolume, NodePublishVolume, NodeUnpublishVolume,
// NodeExpandVolume), answering ABORTED when busy. Install it on the driver's CSI gRPC server
// (grpc.ChainUnaryInterceptor) and the driver's Node service shares the Healer's locks without
// a change to its handlers. Other calls pass through.
func (l *Locks) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !lockedNodeMethods[info.FullMethod] {
			return handler(ctx, req)
		}
		r, ok := req.(interface{ GetVolumeId() string })
		if !ok || r.GetVolumeId() == "" {
			// Nothing to lock on: the handler rejects the missing volume ID itself.
			return handler(ctx, req)
		}
		unlock, err := l.Lock(r.GetVolumeId())
		if err != nil {
			return nil, err
		}
		defer unlock()
		return handler(ctx, req)
	}
}
