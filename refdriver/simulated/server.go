package simulated

import (
	"google.golang.org/grpc"

	"github.com/volume-healer/volume-healer/refdriver/control"
)

// ServerOptions configure the server of a Driver: its CSI-Addons socket, its control socket,
// its shutdown bound and its logger.
type ServerOptions = control.ServerOptions

// NewServer serves d's CSI-Addons Identity and Healer services on opts.Endpoint and, when
// opts.ControlEndpoint is set, its control interface. It listens on the sockets at once, so that
// clients can connect as soon as it returns; Start then serves them.
func NewServer(d *Driver, opts ServerOptions) (*control.Server, error) {
	s, err := control.NewServer(opts, d.ControlHandler())
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(s.LogCalls))
	d.Register(srv)
	if err := s.Add(srv, opts.Endpoint); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}
