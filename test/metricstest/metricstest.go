// Package metricstest helps tests see every metric a component registers: a vector is exposed only
// once it has a child, so a Recorder remembers what was registered and gives each vector one.
//
// It must not import the product's packages.
package metricstest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Recorder is a registry that remembers the collectors registered with it.
type Recorder struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

// NewRecorder returns a Recorder over a fresh registry.
func NewRecorder() *Recorder { return &Recorder{Registry: prometheus.NewRegistry()} }

// Register registers c and remembers it.
func (r *Recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registry.Register(c)
}

// MustRegister registers cs and panics on an error, like prometheus.Registry.MustRegister.
func (r *Recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// Touch gives every vector registered so far one child, so that it is exposed. The number of
// labels is found by trying: a vector refuses label values of the wrong count.
func (r *Recorder) Touch(t testing.TB) {
	t.Helper()
	for _, c := range r.collectors {
		var get func(...string) error
		switch v := c.(type) {
		case *prometheus.CounterVec:
			get = func(vals ...string) error { _, err := v.GetMetricWithLabelValues(vals...); return err }
		case *prometheus.GaugeVec:
			get = func(vals ...string) error { _, err := v.GetMetricWithLabelValues(vals...); return err }
		case *prometheus.HistogramVec:
			get = func(vals ...string) error { _, err := v.GetMetricWithLabelValues(vals...); return err }
		case *prometheus.SummaryVec:
			get = func(vals ...string) error { _, err := v.GetMetricWithLabelValues(vals...); return err }
		default:
			continue // a plain metric is always exposed
		}
		touched := false
		for n := 0; n <= 10 && !touched; n++ {
			vals := make([]string, n)
			for i := range vals {
				vals[i] = "x"
			}
			touched = get(vals...) == nil
		}
		if !touched {
			t.Fatalf("could not give the vector %T a child with up to 10 label values", c)
		}
	}
}
