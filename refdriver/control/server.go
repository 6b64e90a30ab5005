package control

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
)

// ServerOptions configure the sockets of a reference driver, in either mode. Zero values take
// the defaults documented on each field.
type ServerOptions struct {
	// Endpoint is the CSI-Addons socket to serve Identity and Healer on, "unix:///path".
	// Required.
	Endpoint string

	// ControlEndpoint is the socket to serve the HTTP control interface on, "unix:///path".
	// Default: none, no control interface.
	ControlEndpoint string

	// ShutdownTimeout bounds how long Start waits for calls in flight (a hung volume's probe,
	// for instance) once its context is done; then it cuts them off. Default: 5s.
	ShutdownTimeout time.Duration

	// Logger is put into the context of every call, for the handlers to log with. Default:
	// discard.
	Logger logr.Logger
}

// Server serves a driver's gRPC servers and its control interface on UNIX sockets.
type Server struct {
	opts      ServerOptions
	servers   []*grpc.Server
	listeners []net.Listener
	names     []string
	control   *http.Server
	ctlLis    net.Listener
}

// NewServer checks opts and listens on opts.ControlEndpoint, when set, for control. The mode
// then adds its gRPC servers with Add; clients can connect to each socket as soon as it is
// added, and Start serves them all. Socket files left by an earlier run are replaced.
func NewServer(opts ServerOptions, control http.Handler) (*Server, error) {
	if opts.Endpoint == "" {
		return nil, fmt.Errorf("%w: Endpoint is required", ErrInvalidOptions)
	}
	if _, err := ParseEndpoint(opts.Endpoint); err != nil {
		return nil, err
	}
	if opts.ShutdownTimeout == 0 {
		opts.ShutdownTimeout = 5 * time.Second
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	s := &Server{opts: opts}
	if opts.ControlEndpoint != "" {
		lis, err := listenUnix(opts.ControlEndpoint)
		if err != nil {
			return nil, err
		}
		s.ctlLis = lis
		s.control = &http.Server{Handler: control, ReadHeaderTimeout: 10 * time.Second}
	}
	return s, nil
}

// Add listens on the socket at endpoint ("unix:///path") for srv.
func (s *Server) Add(srv *grpc.Server, endpoint string) error {
	lis, err := listenUnix(endpoint)
	if err != nil {
		return err
	}
	s.servers = append(s.servers, srv)
	s.listeners = append(s.listeners, lis)
	s.names = append(s.names, endpoint)
	return nil
}

// Close closes the sockets of a Server that will not be started, as when setting it up failed.
func (s *Server) Close() {
	for _, lis := range s.listeners {
		_ = lis.Close()
	}
	if s.ctlLis != nil {
		_ = s.ctlLis.Close()
	}
}

// LogCalls is a gRPC interceptor that gives each call ServerOptions.Logger with the method
// name, so that handlers log through klog.FromContext.
func (s *Server) LogCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	log := s.opts.Logger.WithValues("method", info.FullMethod)
	return handler(klog.NewContext(ctx, log), req)
}

// Start serves until ctx is done, then shuts down: calls in flight get
// ServerOptions.ShutdownTimeout to finish. It returns nil after a shutdown requested through
// ctx, and removes the socket files.
func (s *Server) Start(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	for i, srv := range s.servers {
		g.Go(func() error {
			// ErrServerStopped means ctx was done before serving began: a shutdown, not a failure.
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

// ParseEndpoint returns the socket path of a "unix:///path" endpoint. A bare absolute path is
// accepted too.
func ParseEndpoint(endpoint string) (string, error) {
	path, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok && !strings.HasPrefix(endpoint, "/") {
		return "", fmt.Errorf("%w: endpoint %q must look like unix:///path/to/socket", ErrInvalidOptions, endpoint)
	}
	if !ok {
		path = endpoint
	}
	if path == "" {
		return "", fmt.Errorf("%w: endpoint %q has no socket path", ErrInvalidOptions, endpoint)
	}
	return path, nil
}

func listenUnix(endpoint string) (net.Listener, error) {
	path, err := ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create folder of socket %s: %w", path, err)
	}
	// A socket left by a process that died keeps its file; only a socket file is removed, never
	// anything else that happens to have the name.
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
