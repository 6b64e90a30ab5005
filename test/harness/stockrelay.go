package harness

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/csi-addons/spec/lib/go/identity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// stockRelay serves, on its own UNIX socket, the CSI-Addons Identity service of a driver and
// nothing else: a sidecar pointed at it finds a driver that serves no Healer service (every Healer
// call answers UNIMPLEMENTED), as a stock CSI driver is, while the driver behind it keeps its real
// mounts. The sidecar then probes the driver's volumes itself, node-locally (tier "none").
type stockRelay struct {
	identity.UnimplementedIdentityServer
	conn *grpc.ClientConn
	srv  *grpc.Server
	path string
}

// startStockRelay relays the Identity service of the driver at driverSocket on path.
func startStockRelay(driverSocket, path string) (*stockRelay, error) {
	conn, err := grpc.NewClient("unix://"+driverSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("stock relay to %s: %w", driverSocket, err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		_ = conn.Close()
		return nil, err
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("stock relay on %s: %w", path, err)
	}
	r := &stockRelay{conn: conn, srv: grpc.NewServer(), path: path}
	identity.RegisterIdentityServer(r.srv, r)
	go func() { _ = r.srv.Serve(lis) }()
	return r, nil
}

// GetIdentity relays the driver's answer.
func (r *stockRelay) GetIdentity(ctx context.Context, req *identity.GetIdentityRequest) (*identity.GetIdentityResponse, error) {
	return identity.NewIdentityClient(r.conn).GetIdentity(ctx, req)
}

// GetCapabilities relays the driver's answer.
func (r *stockRelay) GetCapabilities(ctx context.Context, req *identity.GetCapabilitiesRequest) (*identity.GetCapabilitiesResponse, error) {
	return identity.NewIdentityClient(r.conn).GetCapabilities(ctx, req)
}

// Probe relays the driver's answer.
func (r *stockRelay) Probe(ctx context.Context, req *identity.ProbeRequest) (*identity.ProbeResponse, error) {
	return identity.NewIdentityClient(r.conn).Probe(ctx, req)
}

// stop ends the relay.
func (r *stockRelay) stop() {
	r.srv.Stop()
	_ = r.conn.Close()
	_ = os.Remove(r.path)
}
