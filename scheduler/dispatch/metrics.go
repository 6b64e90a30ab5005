package dispatch

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/volume-healer/volume-healer/scheduler"
)

// Metrics are the Dispatcher's instruments. A nil *Metrics records nothing.
type Metrics struct {
	inFlight   *prometheus.GaugeVec
	queued     prometheus.Gauge
	budgetWait *prometheus.HistogramVec
	retries    *prometheus.CounterVec
	givenUp    prometheus.Counter
	budget     *prometheus.GaugeVec
	panics     prometheus.Counter
}

// NewMetrics creates the Dispatcher's instruments and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "volume_healer_dispatch_in_flight",
			Help: "Probe and heal calls in flight, by CSI driver; their sum is bounded by the global budget.",
		}, []string{"driver"}),
		queued: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "volume_healer_dispatch_queued",
			Help: "Volume tasks waiting to start: for their stagger or backoff, for a budget, or for the call on their volume.",
		}),
		budgetWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "volume_healer_dispatch_budget_wait_seconds",
			Help: "Time from a task being allowed to start (stagger and backoff over) to its call starting, by trigger.",
			// From an idle dispatcher (well under a millisecond) to a rollout storm worked off for minutes.
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"trigger"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_dispatch_retries_total",
			Help: "Calls to be repeated, by reason: busy (the driver answered ABORTED), failed, timeout.",
		}, []string{"reason"}),
		givenUp: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "volume_healer_dispatch_given_up_total",
			Help: "Tasks given up because their calls kept failing or kept finding the volume busy.",
		}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "volume_healer_dispatch_task_panics_total",
			Help: "Tasks whose Run or Done panicked; each such task failed alone.",
		}),
		budget: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "volume_healer_dispatch_budget",
			Help: "Configured limit of calls in flight, by scope (global, driver: per driver, node: per node).",
		}, []string{"scope"}),
	}
	for _, r := range []string{retryBusy, retryFailed, retryTimeout} {
		m.retries.WithLabelValues(r)
	}
	for _, t := range []scheduler.Trigger{scheduler.TriggerRestart, scheduler.TriggerSchedule, scheduler.TriggerManual} {
		m.budgetWait.WithLabelValues(string(t))
	}
	reg.MustRegister(m.inFlight, m.queued, m.budgetWait, m.retries, m.givenUp, m.budget, m.panics)
	return m
}

func (m *Metrics) setQueued(n int) {
	if m == nil {
		return
	}
	m.queued.Set(float64(n))
}

func (m *Metrics) retried(reason string) {
	if m == nil {
		return
	}
	m.retries.WithLabelValues(reason).Inc()
}

func (m *Metrics) panicked() {
	if m == nil {
		return
	}
	m.panics.Inc()
}

func (m *Metrics) gaveUp() {
	if m == nil {
		return
	}
	m.givenUp.Inc()
}
