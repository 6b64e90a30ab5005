package policy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the policy engine's Prometheus instruments. A nil *Metrics records nothing.
type Metrics struct {
	evalDuration prometheus.Histogram
	decisions    map[Action]prometheus.Counter
	evalErrors   *prometheus.CounterVec
	loadErrors   *prometheus.CounterVec
	revision     *prometheus.GaugeVec
	memoLookups  *prometheus.CounterVec
	memoHit      prometheus.Counter
	memoMiss     prometheus.Counter
	rejected     prometheus.Gauge
}

// NewMetrics creates the policy metrics and registers them with reg. It panics when reg holds
// metrics of the same names already, as prometheus.Registerer.MustRegister does.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		evalDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "volume_healer_policy_evaluation_duration_seconds",
			Help: "Time to reach one policy decision, memoized or evaluated.",
			// From a memo hit (about a microsecond) to the evaluation timeout.
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 11),
		}),
		evalErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_policy_evaluation_errors_total",
			Help: "Policy evaluations that produced no decision, by kind of error.",
		}, []string{"reason"}),
		loadErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_policy_load_errors_total",
			Help: "Policy revisions rejected; the previous revision kept serving. By kind of error.",
		}, []string{"reason"}),
		revision: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "volume_healer_policy_revision_info",
			Help: "The policy revision serving decisions (value 1).",
		}, []string{"revision"}),
		memoLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_policy_memo_lookups_total",
			Help: "Decisions looked up in the memo of the serving revision, by result (hit, miss).",
		}, []string{"result"}),
		rejected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "volume_healer_policy_rejected",
			Help: "1 while the newest policy set is rejected and the last good revision serves instead; 0 once a set loads.",
		}),
		decisions: map[Action]prometheus.Counter{},
	}
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volume_healer_policy_decisions_total",
		Help: "Policy decisions, by action.",
	}, []string{"action"})
	for _, a := range actions {
		m.decisions[a] = decisions.WithLabelValues(string(a))
	}
	for _, k := range errorKinds {
		m.evalErrors.WithLabelValues(string(k))
		m.loadErrors.WithLabelValues(string(k))
	}
	m.memoHit = m.memoLookups.WithLabelValues("hit")
	m.memoMiss = m.memoLookups.WithLabelValues("miss")
	reg.MustRegister(m.evalDuration, decisions, m.evalErrors, m.loadErrors, m.revision, m.memoLookups, m.rejected)
	return m
}

func (m *Metrics) observeDecision(d Decision, err error, memoized bool, took time.Duration, memoOn bool) {
	if m == nil {
		return
	}
	m.evalDuration.Observe(took.Seconds())
	if err != nil {
		m.evalErrors.WithLabelValues(string(errorKindOf(err))).Inc()
	} else if c, ok := m.decisions[d.Action]; ok {
		c.Inc()
	}
	if memoOn {
		if memoized {
			m.memoHit.Inc()
		} else {
			m.memoMiss.Inc()
		}
	}
}

func (m *Metrics) loadError(kind ErrorKind) {
	if m == nil {
		return
	}
	m.loadErrors.WithLabelValues(string(kind)).Inc()
	m.rejected.Set(1)
}

// markRejected keeps the rejection visible while a fallback (the last accepted copy, or the
// fail-closed policy) serves in place of a rejected configured set.
func (m *Metrics) markRejected() {
	if m == nil {
		return
	}
	m.rejected.Set(1)
}

func (m *Metrics) serving(revision string) {
	if m == nil {
		return
	}
	m.revision.Reset()
	m.revision.WithLabelValues(revision).Set(1)
	m.rejected.Set(0)
}
