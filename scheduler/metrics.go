package scheduler

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the scheduler's instruments. A nil *Metrics records nothing.
type Metrics struct {
	scheduleErrors  prometheus.Counter
	scheduleInvalid *prometheus.GaugeVec
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
		triggers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_scheduler_triggers_total",
			Help: "Sweeps requested, by trigger (restart, schedule, manual).",
		}, []string{"trigger"}),
	}
	reg.MustRegister(m.scheduleErrors, m.scheduleInvalid, m.triggers)
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

func (m *Metrics) triggered(t Trigger) {
	if m == nil {
		return
	}
	m.triggers.WithLabelValues(string(t)).Inc()
}
