package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
)

// DefaultShutdownTimeout bounds how long reviews in flight get once a Server stops, unless
// Options say otherwise; the API server waits for a review no longer than 30 seconds.
const DefaultShutdownTimeout = 30 * time.Second

// Options configure a Server.
type Options struct {
	// Addr is the host:port the webhook listens on. Required.
	Addr string
	// CertFile and KeyFile hold the PEM serving certificate (its chain after it) and its key. They
	// are read at NewServer and again whenever they change, as a renewed Secret's files do.
	// Required.
	CertFile, KeyFile string
	// Checker judges the changes. Required.
	Checker Checker
	// Metrics counts the reviews. Default nil: no metrics.
	Metrics *Metrics
	// Limits bound the size, number and time of the reviews. Default: Limits' defaults.
	Limits Limits
	// ShutdownTimeout bounds how long reviews in flight get once the server stops. Default
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Handlers are further admission webhooks served on the same listener and certificate, by
	// path (the propagation webhook of package admission/propagation). Default none.
	Handlers map[string]http.Handler
}

// Server serves the Handler over HTTPS on Path. It runs on every replica, leader or not: the API
// server's Service sends reviews to any ready replica.
type Server struct {
	opts      Options
	certs     *certwatcher.CertWatcher
	listening atomic.Bool
}

// NewServer reads the certificate, so that a missing or broken one stops the controller at start
// rather than failing every review.
func NewServer(o Options) (*Server, error) {
	switch {
	case o.Addr == "":
		return nil, errors.New("webhook: no address to listen on")
	case o.CertFile == "" || o.KeyFile == "":
		return nil, errors.New("webhook: a serving certificate and its key are required")
	case o.Checker == nil:
		return nil, errors.New("webhook: no Checker")
	}
	for path, h := range o.Handlers {
		if path == Path || !strings.HasPrefix(path, "/") || h == nil {
			return nil, fmt.Errorf("webhook: handler path %q is taken, not absolute, or has no handler", path)
		}
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	certs, err := certwatcher.New(o.CertFile, o.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("webhook serving certificate %s and key %s: %w", o.CertFile, o.KeyFile, err)
	}
	return &Server{opts: o, certs: certs}, nil
}

// NeedLeaderElection reports that every replica serves the webhook.
func (s *Server) NeedLeaderElection() bool { return false }

// Ready is a readiness check: an error until the server listens, and after it stopped.
func (s *Server) Ready(*http.Request) error {
	if !s.listening.Load() {
		return errors.New("the policy webhook is not listening")
	}
	return nil
}

// Start serves until ctx ends, then gives the reviews in flight up to ShutdownTimeout.
func (s *Server) Start(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("webhook")
	ctx = klog.NewContext(ctx, logger)
	ln, err := net.Listen("tcp", s.opts.Addr)
	if err != nil {
		return fmt.Errorf("webhook listener on %s: %w", s.opts.Addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle(Path, NewHandler(s.opts.Checker, s.opts.Metrics, s.opts.Limits))
	for path, h := range s.opts.Handlers {
		mux.Handle(path, h)
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		// The API server sends a review at once and waits at most 30 seconds for the answer.
		ReadTimeout:  30 * time.Second,
		WriteTimeout: 45 * time.Second,
		IdleTimeout:  90 * time.Second,
		// Reviews carry the logger; a review in flight at shutdown finishes, uncancelled.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	tlsCfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: s.certs.GetCertificate,
		// The API server speaks HTTP/1.1 to webhooks as well as HTTP/2; one connection per
		// review in flight is plenty for policy changes.
		NextProtos: []string{"http/1.1"},
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := s.certs.Start(gctx); err != nil {
			return fmt.Errorf("watching the webhook certificate %s and key %s: %w", s.opts.CertFile, s.opts.KeyFile, err)
		}
		return nil
	})
	g.Go(func() error {
		s.listening.Store(true)
		paths := []string{Path}
		for path := range s.opts.Handlers {
			paths = append(paths, path)
		}
		logger.Info("Serving the admission webhooks", "address", ln.Addr().String(), "paths", paths)
		if err := srv.Serve(tls.NewListener(ln, tlsCfg)); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("webhook server: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		s.listening.Store(false)
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.ShutdownTimeout)
		defer cancel()
		return srv.Shutdown(shutdownCtx)
	})
	return g.Wait()
}
