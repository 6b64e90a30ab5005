package trigger

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/volume-healer/volume-healer/scheduler"
)

// Metrics are the scheduler's instruments. A nil *Metrics records nothing.
type Metrics struct {
	scheduleErrors  prometheus.Counter
	scheduleInvalid *prometheus.GaugeVec
	interval        *prometheus.GaugeVec
	triggers        *prometheus.CounterVec
}

// NewMetrics creates the scheduler's instruments and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		scheduleErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "volume_healer_scheduler_schedule_errors_total",
			Help: "StorageClass schedule annotations rejected because they do not parse.",
		}),
		scheduleInvalid: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "volume_healer_scheduler_schedule_invalid",
			Help: "1 while a StorageClass's schedule annotation is invalid and its previous schedule stays in force.",
		}, []string{"storageclass"}),
		interval: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "volume_healer_schedule_interval_seconds",
			Help: "Longest time a StorageClass may go between two finished periodic sweeps while its schedule works: the longest gap between two firings of its schedule plus the stagger. No series while the class has no schedule.",
		}, []string{"storageclass"}),
		triggers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_scheduler_triggers_total",
			Help: "Sweeps requested, by trigger (restart, schedule, manual).",
		}, []string{"trigger"}),
	}
	reg.MustRegister(m.scheduleErrors, m.scheduleInvalid, m.interval, m.triggers)
	return m
}

func (m *Metrics) invalidSchedule(storageClass string) {
	if m == nil {
		return
	}
	m.scheduleErrors.Inc()
	m.scheduleInvalid.WithLabelValues(storageClass).Set(1)
}

func (m *Metrics) clearInvalid(storageClass string) {
	if m == nil {
		return
	}
	m.scheduleInvalid.DeleteLabelValues(storageClass)
}

// setInterval publishes how long storageClass may go without a finished periodic sweep; the
// overdue alert compares the time since its last sweep with this.
func (m *Metrics) setInterval(storageClass string, d time.Duration) {
	if m == nil {
		return
	}
	m.interval.WithLabelValues(storageClass).Set(d.Seconds())
}

// clearInterval removes the series of a class that has no schedule any more, so that the alert
// stops expecting sweeps of it.
func (m *Metrics) clearInterval(storageClass string) {
	if m == nil {
		return
	}
	m.interval.DeleteLabelValues(storageClass)
}

func (m *Metrics) triggered(t scheduler.Trigger) {
	if m == nil {
		return
	}
	m.triggers.WithLabelValues(string(t)).Inc()
}
