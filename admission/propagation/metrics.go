package propagation

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Request results, the values of the label result.
const (
	// ResultPatched is a pod let through with mountPropagation set on some of its mounts.
	ResultPatched = "patched"
	// ResultUnchanged is a pod let through as it came: no claim volume, nothing the policy asked
	// to change, or not a pod creation.
	ResultUnchanged = "unchanged"
	// ResultFailedOpen is a pod let through unchanged because the webhook could not decide for
	// it: the policy failed, a claim was not found, a read failed. An Event says which.
	ResultFailedOpen = "failed_open"
	// ResultRefused is a request answered with an HTTP error (malformed, too large, too many at
	// once): the API server applies the failurePolicy, Ignore, and creates the pod unchanged.
	ResultRefused = "refused"
)

// Metrics are the webhook's Prometheus instruments. A nil *Metrics records nothing.
type Metrics struct {
	requests map[string]prometheus.Counter
	duration prometheus.Histogram
}

// NewMetrics creates the webhook's metrics and registers them with reg. It panics when reg holds
// metrics of the same names already, as prometheus.Registerer.MustRegister does.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volume_healer_propagation_webhook_requests_total",
		Help: "Pod admission requests the mount propagation webhook answered, by result (patched, unchanged, failed_open, refused). Every result lets the pod be created.",
	}, []string{"result"})
	m := &Metrics{
		requests: map[string]prometheus.Counter{},
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "volume_healer_propagation_webhook_request_duration_seconds",
			Help: "Time to answer one pod admission request of the mount propagation webhook, the policy's evaluation included.",
			// From a pod without claims (well under a millisecond) to past the webhook's timeout.
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 10),
		}),
	}
	for _, r := range []string{ResultPatched, ResultUnchanged, ResultFailedOpen, ResultRefused} {
		m.requests[r] = requests.WithLabelValues(r)
	}
	reg.MustRegister(requests, m.duration)
	return m
}

func (m *Metrics) observe(result string, took time.Duration) {
	if m == nil {
		return
	}
	m.requests[result].Inc()
	m.duration.Observe(took.Seconds())
}
