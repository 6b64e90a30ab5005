package evict

import "github.com/prometheus/client_golang/prometheus"

// Eviction results, the values of the result label of volume_healer_evictions_total.
const (
	// ResultEvicted: the API server accepted the eviction.
	ResultEvicted = "evicted"
	// ResultBlocked: the API server refused it with 429, a PodDisruptionBudget would be violated;
	// it is tried again with backoff.
	ResultBlocked = "blocked"
	// ResultError: the call failed otherwise; it is tried again with backoff.
	ResultError = "error"
	// ResultDryRun: dry-run recorded the eviction without making it.
	ResultDryRun = "dry_run"
	// ResultLeftAlone: the policy's restart decision was leave.
	ResultLeftAlone = "left_alone"
	// ResultPolicyFailed: the policy failed to decide; the pod was left alone.
	ResultPolicyFailed = "policy_failed"
)

// Metrics are the eviction instruments. A nil *Metrics records nothing.
type Metrics struct {
	evictions *prometheus.CounterVec
	throttled prometheus.Counter
	// goroutinePanics counts panics recovered in the evictor's goroutines, by goroutine.
	goroutinePanics *prometheus.CounterVec
}

// NewMetrics creates the instruments and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_evictions_total",
			Help: "Evictions of pods that still saw a healed volume's dead mount, by result (evicted; blocked: a PodDisruptionBudget refused it and it is tried again; error; dry_run; left_alone: the policy said leave; policy_failed: the policy failed to decide).",
		}, []string{"result"}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "volume_healer_evictions_throttled_total",
			Help: "Evictions postponed because the eviction budget (remediation.evictionsPerMinute or remediation.evictionsPerNamespacePerMinute) was spent.",
		}),
		goroutinePanics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_evictions_goroutine_panics_total",
			Help: "Panics recovered in the evictor's goroutines, by goroutine (worker: handling one request, which is then dropped; reprobe: asking for a volume's probe after its evictions); the controller went on.",
		}, []string{"goroutine"}),
	}
	reg.MustRegister(m.evictions, m.throttled, m.goroutinePanics)
	for _, g := range []string{goroutineWorker, goroutineReprobe} {
		m.goroutinePanics.WithLabelValues(g)
	}
	for _, r := range []string{ResultEvicted, ResultBlocked, ResultError, ResultDryRun, ResultLeftAlone, ResultPolicyFailed} {
		m.evictions.WithLabelValues(r)
	}
	return m
}

func (m *Metrics) eviction(result string) {
	if m != nil {
		m.evictions.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) throttle() {
	if m != nil {
		m.throttled.Inc()
	}
}

func (m *Metrics) goroutinePanicked(goroutine string) {
	if m != nil {
		m.goroutinePanics.WithLabelValues(goroutine).Inc()
	}
}
