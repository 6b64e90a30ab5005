package kubelet

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// Dial connects to the CSI socket at endpoint, "unix:///path/to/csi.sock" as in kubelet's plugin
// registration or a plain absolute path, and waits until the connection is ready or ctx ends.
func Dial(ctx context.Context, endpoint string) (*grpc.ClientConn, error) {
	path := strings.TrimPrefix(endpoint, "unix://")
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("CSI endpoint %q: want unix:///absolute/path or an absolute path", endpoint)
	}
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("CSI endpoint %s: %w", endpoint, err)
	}
	conn.Connect()
	for {
		state := conn.GetState()
		if state == connectivity.Ready {
			return conn, nil
		}
		if !conn.WaitForStateChange(ctx, state) {
			_ = conn.Close()
			return nil, fmt.Errorf("CSI endpoint %s: not ready (%s): %w", endpoint, state, ctx.Err())
		}
	}
}
