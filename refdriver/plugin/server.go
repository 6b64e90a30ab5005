package plugin

import (
	"cmp"
	"path/filepath"

	"google.golang.org/grpc"

	"github.com/volume-healer/volume-healer/refdriver/control"
)

// ServerOptions configure the server of a Plugin. Zero values take the defaults documented on
// each field.
type ServerOptions struct {
	// ServerOptions are the sockets every mode has: Endpoint is the CSI-Addons socket
	// (CSI-Addons Identity and Healer), ControlEndpoint the control interface's.
	control.ServerOptions

	// CSIEndpoint is the CSI socket, "unix:///path": CSI Identity, Controller and Node. The
	// services of the two sockets have different names (csi.v1.Identity, identity.Identity), so
	// one server can carry them all. Default: Endpoint.
	CSIEndpoint string
}

// NewServer serves p on UNIX sockets. It listens on them at once, so that clients can connect
// as soon as it returns; Start then serves them. Stopping the server leaves the mounters
// running: the volumes stay usable while the plugin restarts, as long as its process group
// lives.
func NewServer(p *Plugin, opts ServerOptions) (*control.Server, error) {
	s, err := control.NewServer(opts.ServerOptions, p.ControlHandler())
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	csiEndpoint := cmp.Or(opts.CSIEndpoint, opts.Endpoint)
	addonsPath, err := control.ParseEndpoint(opts.Endpoint)
	if err != nil {
		return nil, err
	}
	csiPath, err := control.ParseEndpoint(csiEndpoint)
	if err != nil {
		return nil, err
	}

	// The Node calls take the volume's lock in the interceptor; the Healer calls take it in
	// the kit. Both kinds may share one server.
	interceptors := grpc.ChainUnaryInterceptor(s.LogCalls, p.countCalls, p.locks.UnaryServerInterceptor())
	addons := grpc.NewServer(interceptors)
	if err := p.RegisterAddons(addons); err != nil {
		return nil, err
	}
	if err := s.Add(addons, opts.Endpoint); err != nil {
		return nil, err
	}
	csiServer := addons
	if filepath.Clean(csiPath) != filepath.Clean(addonsPath) {
		csiServer = grpc.NewServer(interceptors)
		if err := s.Add(csiServer, csiEndpoint); err != nil {
			return nil, err
		}
	}
	p.Register(csiServer)
	ok = true
	return s, nil
}
