package healer

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/volume-healer/volume-healer/probe"
)

// Metrics are the instruments of sweeps, probes and heals. A nil *Metrics records nothing.
type Metrics struct {
	sweepsStarted  *prometheus.CounterVec
	sweepsFinished *prometheus.CounterVec
	sweepDuration  *prometheus.HistogramVec
	decisions      *prometheus.CounterVec
	probes         *prometheus.CounterVec
	heals          *prometheus.CounterVec
	callDuration   *prometheus.HistogramVec
	healFailing    *prometheus.GaugeVec
	callErrors     *prometheus.CounterVec
}

// NewMetrics creates the instruments and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		sweepsStarted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_sweeps_started_total",
			Help: "Sweeps started, by trigger.",
		}, []string{"trigger"}),
		sweepsFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_sweeps_finished_total",
			Help: "Sweeps finished, by trigger and result (ok: every volume handled; failed: some volume failed; cancelled).",
		}, []string{"trigger", "result"}),
		sweepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "volume_healer_sweep_duration_seconds",
			Help:    "Time from a sweep's start to its last volume's outcome, by trigger.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14),
		}, []string{"trigger"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_sweep_decisions_total",
			Help: "First decisions of sweeps per volume, by trigger and action (probe, heal, skip).",
		}, []string{"trigger", "action"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_probes_total",
			Help: "Probe calls, by driver and result (healthy, unhealthy, error).",
		}, []string{"driver", "result"}),
		heals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_heals_total",
			Help: "Heal calls, by driver and result (healed, failed, error).",
		}, []string{"driver", "result"}),
		callDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "volume_healer_call_duration_seconds",
			Help:    "Duration of probe and heal calls to the sidecars, by operation.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}, []string{"operation"}),
		healFailing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "volume_healer_volume_heal_failing",
			Help: "1 for each PVC whose last heal failed; the series goes away when the volume is healthy again.",
		}, []string{"namespace", "persistentvolumeclaim", "driver"}),
		callErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_sidecar_call_errors_total",
			Help: "Failed calls to sidecars, by driver and reason (unreachable, timeout, rejected, busy, not-staged, unsupported, not-found, malformed, other).",
		}, []string{"driver", "reason"}),
	}
	reg.MustRegister(m.callErrors, m.sweepsStarted, m.sweepsFinished, m.sweepDuration, m.decisions, m.probes, m.heals, m.callDuration, m.healFailing)
	return m
}

// callError counts a failed sidecar call under a bounded reason.
func (m *Metrics) callError(driver string, err error) {
	if m == nil || err == nil {
		return
	}
	m.callErrors.WithLabelValues(driver, errorReason(err)).Inc()
}

func errorReason(err error) string {
	for _, r := range []struct {
		err    error
		reason string
	}{
		{probe.ErrUnreachable, "unreachable"}, {probe.ErrNoEndpoint, "unreachable"}, {probe.ErrTimeout, "timeout"},
		{probe.ErrRejected, "rejected"}, {probe.ErrBusy, "busy"}, {probe.ErrNotStaged, "not-staged"},
		{probe.ErrUnsupported, "unsupported"}, {probe.ErrNotFound, "not-found"}, {probe.ErrMalformed, "malformed"},
	} {
		if errors.Is(err, r.err) {
			return r.reason
		}
	}
	return "other"
}
