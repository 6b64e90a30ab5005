package webhook

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Review results, the values of the label result.
const (
	// ResultAllowed is a change let through: one the controller would accept, or none of the
	// webhook's business (a delete, a ConfigMap outside the policy set, an annotation written).
	ResultAllowed = "allowed"
	// ResultDenied is a change the controller would reject, refused.
	ResultDenied = "denied"
	// ResultError is a review the webhook could not judge: a malformed request, the policy
	// ConfigMaps not read yet, the caller gone. The API server applies the failurePolicy.
	ResultError = "error"
)

// Metrics are the webhook's Prometheus instruments. A nil *Metrics records nothing.
type Metrics struct {
	reviews  map[string]prometheus.Counter
	duration prometheus.Histogram
}

// NewMetrics creates the webhook metrics and registers them with reg. It panics when reg holds
// metrics of the same names already, as prometheus.Registerer.MustRegister does.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	reviews := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volume_healer_webhook_reviews_total",
		Help: "Admission reviews of policy ConfigMaps answered, by result (allowed, denied, error).",
	}, []string{"result"})
	m := &Metrics{
		reviews: map[string]prometheus.Counter{},
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "volume_healer_webhook_review_duration_seconds",
			Help: "Time to answer one admission review of a policy ConfigMap, compiling and validating the policy set included.",
			// From an answer without compiling (a millisecond) to past the webhook's timeout.
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 10),
		}),
	}
	for _, r := range []string{ResultAllowed, ResultDenied, ResultError} {
		m.reviews[r] = reviews.WithLabelValues(r)
	}
	reg.MustRegister(reviews, m.duration)
	return m
}

func (m *Metrics) observe(result string, took time.Duration) {
	if m == nil {
		return
	}
	m.reviews[result].Inc()
	m.duration.Observe(took.Seconds())
}
