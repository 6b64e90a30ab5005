package driverkit_test

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/volume-healer/volume-healer/driverkit"
)

func TestLocksTryLock(t *testing.T) {
	var l driverkit.Locks
	unlock, ok := l.TryLock("vol-1")
	if !ok {
		t.Fatal("TryLock of a free volume failed")
	}
	if _, ok := l.TryLock("vol-1"); ok {
		t.Fatal("TryLock of a held volume succeeded")
	}
	unlock2, ok := l.TryLock("vol-2")
	if !ok {
		t.Fatal("TryLock of another volume failed while vol-1 is held")
	}
	defer unlock2()

	unlock()
	unlock() // harmless
	again, ok := l.TryLock("vol-1")
	if !ok {
		t.Fatal("TryLock after unlock failed")
	}
	unlock() // a stale unlock must not release the new holder's lock
	if _, ok := l.TryLock("vol-1"); ok {
		t.Fatal("an unlock called twice released a lock taken after it")
	}
	again()
}

func TestLocksLockAborted(t *testing.T) {
	var l driverkit.Locks
	unlock, err := l.Lock("pvc-1")
	if err != nil {
		t.Fatalf("Lock of a free volume: %v", err)
	}
	defer unlock()
	_, err = l.Lock("pvc-1")
	if status.Code(err) != codes.Aborted || !strings.Contains(status.Convert(err).Message(), "pvc-1") {
		t.Fatalf("Lock of a busy volume: %v, want ABORTED naming the volume", err)
	}
}

func TestLocksUnaryServerInterceptor(t *testing.T) {
	var l driverkit.Locks
	intercept := l.UnaryServerInterceptor()
	info := func(method string) *grpc.UnaryServerInfo { return &grpc.UnaryServerInfo{FullMethod: method} }

	tests := map[string]struct {
		method      string
		req         any
		busy        bool
		wantCode    codes.Code
		wantHandled bool
		wantLocked  bool // the volume's lock is held while the handler runs
	}{
		"NodeStageVolume of a free volume runs locked": {
			method: csi.Node_NodeStageVolume_FullMethodName, req: &csi.NodeStageVolumeRequest{VolumeId: "v"},
			wantHandled: true, wantLocked: true,
		},
		"NodeUnpublishVolume of a busy volume is ABORTED": {
			method: csi.Node_NodeUnpublishVolume_FullMethodName, req: &csi.NodeUnpublishVolumeRequest{VolumeId: "v"},
			busy: true, wantCode: codes.Aborted,
		},
		"NodeExpandVolume of a busy volume is ABORTED": {
			method: csi.Node_NodeExpandVolume_FullMethodName, req: &csi.NodeExpandVolumeRequest{VolumeId: "v"},
			busy: true, wantCode: codes.Aborted,
		},
		"NodeGetVolumeStats passes through a busy volume": {
			method: csi.Node_NodeGetVolumeStats_FullMethodName, req: &csi.NodeGetVolumeStatsRequest{VolumeId: "v"},
			busy: true, wantHandled: true, wantLocked: true, // by the other operation
		},
		"NodeGetCapabilities passes through": {
			method: csi.Node_NodeGetCapabilities_FullMethodName, req: &csi.NodeGetCapabilitiesRequest{},
			wantHandled: true,
		},
		"NodePublishVolume without a volume ID reaches the handler to be rejected": {
			method: csi.Node_NodePublishVolume_FullMethodName, req: &csi.NodePublishVolumeRequest{},
			wantHandled: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if tc.busy {
				unlock, ok := l.TryLock("v")
				if !ok {
					t.Fatal("the volume is still locked by an earlier case")
				}
				defer unlock()
			}
			handled, locked := false, false
			handler := func(ctx context.Context, req any) (any, error) {
				handled = true
				if unlock, ok := l.TryLock("v"); ok {
					unlock()
				} else {
					locked = true
				}
				return "answer", nil
			}
			resp, err := intercept(context.Background(), tc.req, info(tc.method), handler)
			if status.Code(err) != tc.wantCode {
				t.Fatalf("interceptor: %v, want code %s", err, tc.wantCode)
			}
			if handled != tc.wantHandled || locked != tc.wantLocked {
				t.Fatalf("handler ran: %t (locked: %t), want %t (locked: %t)", handled, locked, tc.wantHandled, tc.wantLocked)
			}
			if tc.wantHandled && resp != "answer" {
				t.Errorf("interceptor returned %v, not the handler's answer", resp)
			}
			if !tc.busy {
				unlock, ok := l.TryLock("v")
				if !ok {
					t.Fatal("the interceptor did not release the volume's lock")
				}
				unlock()
			}
		})
	}
}
