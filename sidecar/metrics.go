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
	// restarts counts RestartContainers calls by result; runtimeUp says whether the runtime answers.
	restarts  *prometheus.CounterVec
	runtimeUp prometheus.Gauge
}

// Results of volume_healer_sidecar_container_restarts_total.
const (
	restartDone        = "restarted"
	restartNoContainer = "no_container"
	restartBusy        = "busy"
	restartNoRuntime   = "no_runtime"
	restartUnavailable = "unavailable"
	restartTimeout     = "timeout"
	restartRefused     = "refused"
	restartError       = "error"
)

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
			Help: "Panics recovered in the sidecar's own goroutines, by goroutine (registration: writing the restart marker, started again; " +
				"registration_watch: keeping the CSIAddonsNode's annotations, started again); the sidecar went on.",
		}, []string{"goroutine"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_sidecar_container_restarts_total",
			Help: "RestartContainers calls of authenticated callers, by result: restarted (containers stopped for kubelet " +
				"to start again), no_container (no running container of the pod mounts the volume), busy (one in flight " +
				"for the same volume and pod), no_runtime (no runtime socket given), unavailable, timeout, refused " +
				"(a bad request, an unknown PV), error.",
		}, []string{"result"}),
		runtimeUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "volume_healer_sidecar_container_runtime_reachable",
			Help: "1 while the container runtime the sidecar was given (--container-runtime-endpoint) answers, " +
				"0 while it does not or when none was given.",
		}),
	}
	for _, g := range goroutines {
		m.goroutinePanics.WithLabelValues(g)
	}
	reg.MustRegister(m.calls, m.callDuration, m.authFailures, m.driverErrors, m.panics, m.goroutinePanics, m.restarts, m.runtimeUp,
		versionmetrics.NewBuildInfo(version.Get()))
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

// containerRestart counts a RestartContainers call by the gRPC code of its answer.
func (m *Metrics) containerRestart(code codes.Code) {
	if m == nil {
		return
	}
	result := restartError
	switch code {
	case codes.OK:
		result = restartDone
	case codes.FailedPrecondition:
		result = restartNoContainer
	case codes.Aborted:
		result = restartBusy
	case codes.Unimplemented:
		result = restartNoRuntime
	case codes.Unavailable:
		result = restartUnavailable
	case codes.DeadlineExceeded:
		result = restartTimeout
	case codes.InvalidArgument, codes.NotFound:
		result = restartRefused
	}
	m.restarts.WithLabelValues(result).Inc()
}

// runtimeReachable sets whether the container runtime answers.
func (m *Metrics) runtimeReachable(up bool) {
	if m == nil {
		return
	}
	v := 0.0
	if up {
		v = 1
	}
	m.runtimeUp.Set(v)
}
