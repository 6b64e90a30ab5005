package controller

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metricsServer serves the controller's registry on /metrics. It runs on every replica, leader or
// not, so that a standby is visible too.
type metricsServer struct {
	addr     string
	registry *prometheus.Registry
}

// NeedLeaderElection reports that the metrics endpoint runs on standby replicas too.
func (m *metricsServer) NeedLeaderElection() bool { return false }

// Start serves until ctx ends, then shuts down within shutdownTimeout.
func (m *metricsServer) Start(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry}))
	ln, err := net.Listen("tcp", m.addr)
	if err != nil {
		return fmt.Errorf("metrics listener on %s: %w", m.addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics server: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	return srv.Shutdown(shutdownCtx)
}
