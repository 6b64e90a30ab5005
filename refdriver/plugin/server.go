package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/refdriver/driver"
)

// ServerOptions configure a Server. Zero values take the defaults documented on each field.
type ServerOptions struct {
	// Endpoint is the CSI-Addons socket, "unix:///path": CSI-Addons Identity and Healer.
	// Required.
	Endpoint string

	// CSIEndpoint is the CSI socket, "unix:///path": CSI Identity, Controller and Node. The
	// services of the two sockets have different names (csi.v1.Identity, identity.Identity), so
	// one server can carry them all. Default: Endpoint.
	CSIEndpoint string

	// ControlEndpoint is the socket of the HTTP control interface, "unix:///path".
	// Default: none.
	ControlEndpoint string

	// ShutdownTimeout bounds how long Start waits for calls in flight once its context is
	// done; then it cuts them off. Default: 5s.
	ShutdownTimeout time.Duration

	// Logger is put into the context of every call. Default: discard.
	Logger logr.Logger
}

// Server serves a Plugin on UNIX sockets. Stopping it leaves the mounters running: the volumes
// stay usable while the plugin restarts, as long as its process group lives.
type Server struct {
	opts      ServerOptions
	servers   []*grpc.Server
	listeners []net.Listener
	names     []string
	control   *http.Server
	ctlLis    net.Listener
}

// NewServer listens on the sockets at once, so that clients can connect as soon as it
// returns; Start then serves them. Socket files left by an earlier run are replaced.
func NewServer(p *Plugin, opts ServerOptions) (*Server, error) {
	if opts.Endpoint == "" {
		return nil, fmt.Errorf("%w: Endpoint is required", ErrInvalidOptions)
	}
	if opts.CSIEndpoint == "" {
		opts.CSIEndpoint = opts.Endpoint
	}
	if opts.ShutdownTimeout == 0 {
		opts.ShutdownTimeout = 5 * time.Second
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	addonsPath, err := driver.ParseEndpoint(opts.Endpoint)
	if err != nil {
		return nil, err
	}
	csiPath, err := driver.ParseEndpoint(opts.CSIEndpoint)
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts}
	ok := false
	defer func() {
		if !ok {
			s.closeListeners()
		}
	}()

	// The Node calls take the volume's lock in the interceptor; the Healer calls take it in
	// the kit. Both kinds may share one server.
	interceptors := grpc.ChainUnaryInterceptor(s.withLogger, p.counters.interceptor(), p.locks.UnaryServerInterceptor())
	addons := grpc.NewServer(interceptors)
	if err := p.RegisterAddons(addons); err != nil {
		return nil, err
	}
	if err := s.add(addons, addonsPath); err != nil {
		return nil, err
	}
	csiServer := addons
	if filepath.Clean(csiPath) != filepath.Clean(addonsPath) {
		csiServer = grpc.NewServer(interceptors)
		if err := s.add(csiServer, csiPath); err != nil {
			return nil, err
		}
	}
	p.Register(csiServer)

	if opts.ControlEndpoint != "" {
		path, err := driver.ParseEndpoint(opts.ControlEndpoint)
		if err != nil {
			return nil, err
		}
		if s.ctlLis, err = listenUnix(path); err != nil {
			return nil, err
		}
		s.control = &http.Server{Handler: p.ControlHandler(), ReadHeaderTimeout: 10 * time.Second}
	}
	ok = true
	return s, nil
}

func (s *Server) add(srv *grpc.Server, path string) error {
	lis, err := listenUnix(path)
	if err != nil {
		return err
	}
	s.servers = append(s.servers, srv)
	s.listeners = append(s.listeners, lis)
	s.names = append(s.names, path)
	return nil
}

func (s *Server) closeListeners() {
	for _, lis := range s.listeners {
		_ = lis.Close()
	}
	if s.ctlLis != nil {
		_ = s.ctlLis.Close()
	}
}

// withLogger gives each call a logger with the method name, for klog.FromContext.
func (s *Server) withLogger(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	log := s.opts.Logger.WithValues("method", info.FullMethod)
	return handler(klog.NewContext(ctx, log), req)
}

// Start serves until ctx is done, then shuts down: calls in flight get
// ServerOptions.ShutdownTimeout to finish. It returns nil after a shutdown requested through
// ctx.
func (s *Server) Start(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	for i, srv := range s.servers {
		g.Go(func() error {
			if err := srv.Serve(s.listeners[i]); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return fmt.Errorf("serve %s: %w", s.names[i], err)
			}
			return nil
		})
	}
	if s.control != nil {
		g.Go(func() error {
			if err := s.control.Serve(s.ctlLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve control %s: %w", s.opts.ControlEndpoint, err)
			}
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		s.shutdown()
		return nil
	})
	return g.Wait()
}

func (s *Server) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	defer cancel()
	for _, srv := range s.servers {
		stopped := make(chan struct{})
		go func() {
			srv.GracefulStop()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-ctx.Done():
			srv.Stop()
		}
	}
	if s.control != nil {
		if err := s.control.Shutdown(ctx); err != nil {
			_ = s.control.Close()
		}
	}
}

func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create folder of socket %s: %w", path, err)
	}
	// Only a socket file is replaced, never anything else that happens to have the name.
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&fs.ModeSocket != 0 {
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return lis, nil
}
