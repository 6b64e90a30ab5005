package sidecar

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// slowHealer is a driver whose heal takes took, or less if the call's deadline comes first.
type slowHealer struct {
	healerv1alpha1.UnimplementedHealerServer
	took time.Duration
}

func (s slowHealer) HealVolume(ctx context.Context, _ *healerv1alpha1.HealVolumeRequest) (*healerv1alpha1.HealVolumeResponse, error) {
	select {
	case <-time.After(s.took):
		return &healerv1alpha1.HealVolumeResponse{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// A caller that sends a deadline (the controller sends timeouts.heal) gets the driver's answer
// within that deadline even when it is longer than --driver-timeout, which bounds only calls that
// come without one.
func TestDriverCallKeepsTheCallersDeadline(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "csi-addons.sock")
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healerv1alpha1.RegisterHealerServer(srv, slowHealer{took: 500 * time.Millisecond})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	d := &driverClient{endpoint: socket, timeout: 100 * time.Millisecond, healer: healerv1alpha1.NewHealerClient(conn)}

	tests := map[string]struct {
		callerDeadline time.Duration // 0: none
		wantErr        bool
	}{
		"a caller's deadline longer than the driver timeout is kept":   {callerDeadline: 2 * time.Second},
		"a caller without a deadline is bounded by the driver timeout": {wantErr: true},
		"a caller's deadline shorter than the heal ends it":            {callerDeadline: 50 * time.Millisecond, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			if tc.callerDeadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.callerDeadline)
				defer cancel()
			}
			cctx, cancel := d.callContext(ctx)
			defer cancel()
			_, err := d.healer.HealVolume(cctx, &healerv1alpha1.HealVolumeRequest{VolumeId: "v"})
			if (err != nil) != tc.wantErr {
				t.Errorf("heal: %v, want error %v", err, tc.wantErr)
			}
		})
	}
}
