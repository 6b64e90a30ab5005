package sidecar

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/volume-healer/volume-healer/version"
	"github.com/volume-healer/volume-healer/version/versionmetrics"
)

// Reasons of volume_healer_sidecar_auth_failures_total.
const (
	authMissingToken      = "missing_token"
	authInvalidToken      = "invalid_token"
	authForbiddenIdentity = "forbidden_identity"
	authReviewError       = "review_error"
	authRateLimited       = "rate_limited"
)

// Metrics are the sidecar's instruments. A nil *Metrics records nothing.
type Metrics struct {
	calls        *prometheus.CounterVec
	callDuration *prometheus.HistogramVec
	authFailures *prometheus.CounterVec
	driverErrors *prometheus.CounterVec
	panics       *prometheus.CounterVec
	// goroutinePanics counts the panics recovered in the sidecar's own goroutines, by goroutine.
	goroutinePanics *prometheus.CounterVec
}

// NewMetrics creates the sidecar's instruments and registers them with reg, with the build info
// gauge of this binary.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_sidecar_calls_total",
			Help: "NodeHealer calls answered, by RPC and gRPC status code (authentication failures included).",
		}, []string{"rpc", "code"}),
		callDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "volume_healer_sidecar_call_duration_seconds",
			Help: "Time to answer a NodeHealer call, driver time included, by RPC.",
			// From a cached capability answer (sub-millisecond) to a heal that takes the whole
			// driver timeout.
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"rpc"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_sidecar_auth_failures_total",
			Help: "Calls rejected before reaching the driver because of the caller's credentials, by reason " +
				"(missing_token, invalid_token, forbidden_identity, review_error).",
		}, []string{"reason"}),
		driverErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_sidecar_driver_errors_total",
			Help: "Calls to the driver that failed, by gRPC status code; Unavailable means the driver socket " +
				"could not be reached, DeadlineExceeded that the driver did not answer in time.",
		}, []string{"code"}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_sidecar_panics_total",
			Help: "Calls whose handling panicked, by RPC; each was answered Internal and the sidecar went on.",
		}, []string{"rpc"}),
		goroutinePanics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_sidecar_goroutine_panics_total",
			Help: "Panics recovered in the sidecar's own goroutines, by goroutine (read_ahead: reading one volume ahead at a start, " +
				"which is then read by its first call; registration: writing the restart marker, started again; " +
				"registration_watch: keeping the CSIAddonsNode's annotations, started again); the sidecar went on.",
		}, []string{"goroutine"}),
	}
	for _, g := range goroutines {
		m.goroutinePanics.WithLabelValues(g)
	}
	reg.MustRegister(m.calls, m.callDuration, m.authFailures, m.driverErrors, m.panics, m.goroutinePanics, versionmetrics.NewBuildInfo(version.Get()))
	return m
}

func (m *Metrics) call(rpc string, code codes.Code, took time.Duration) {
	if m == nil {
		return
	}
	m.calls.WithLabelValues(rpc, code.String()).Inc()
	m.callDuration.WithLabelValues(rpc).Observe(took.Seconds())
}

func (m *Metrics) authFailure(reason string) {
	if m == nil {
		return
	}
	m.authFailures.WithLabelValues(reason).Inc()
}

func (m *Metrics) driverError(code codes.Code) {
	if m == nil {
		return
	}
	m.driverErrors.WithLabelValues(code.String()).Inc()
}

func (m *Metrics) panicked(rpc string) {
	if m == nil {
		return
	}
	m.panics.WithLabelValues(rpc).Inc()
}

// goroutinePanicked counts a panic recovered in the sidecar's goroutine named goroutine.
func (m *Metrics) goroutinePanicked(goroutine string) {
	if m == nil {
		return
	}
	m.goroutinePanics.WithLabelValues(goroutine).Inc()
}
