package healer

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/scheduler/planner"
)

// Metrics are the instruments of sweeps, probes and heals. A nil *Metrics records nothing.
type Metrics struct {
	sweepsStarted  *prometheus.CounterVec
	sweepsFinished *prometheus.CounterVec
	sweepDuration  *prometheus.HistogramVec
	decisions      *prometheus.CounterVec
	probes         *prometheus.CounterVec
	heals          *prometheus.CounterVec
	// volumesKept counts the volumes restart sweeps found healthy and kept alive by their
	// driver across the restart, beside the heals.
	volumesKept  *prometheus.CounterVec
	callDuration *prometheus.HistogramVec
	healFailing  *prometheus.GaugeVec
	// deadMountSince holds, per claim whose running pods still see its dead mount, when that was
	// first found; deadMountSeen says which claims have the series, so that a later report keeps
	// the first time.
	deadMountSince *prometheus.GaugeVec
	deadMountSeen  sync.Map
	// recyclingSince holds, per claim whose volume is being recycled on a node, when the recycle
	// began.
	recyclingSince *prometheus.GaugeVec
	callErrors     *prometheus.CounterVec
	lastFinished   *prometheus.GaugeVec
	// classFinished holds the last finished periodic sweep per StorageClass, which the overdue
	// alert compares with the class's schedule interval.
	classFinished *prometheus.GaugeVec
	leader        prometheus.Gauge
	// restartsPending counts restart sweeps that did not reach every volume and are being tried
	// again; restartRetries counts those tries.
	restartsPending *prometheus.GaugeVec
	restartRetries  *prometheus.CounterVec
	sweepPanics     *prometheus.CounterVec
	// goroutinePanics counts panics recovered in the goroutines a sweep starts, by goroutine.
	goroutinePanics *prometheus.CounterVec

	// drivers remembers the drivers whose series have been started at zero.
	drivers sync.Map
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
			Help: "First decisions of sweeps per volume, by trigger and action (probe, heal, skip, recycle).",
		}, []string{"trigger", "action"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_probes_total",
			Help: "Probe calls, by driver and result (healthy, unhealthy, error, busy: the driver was busy with the volume).",
		}, []string{"driver", "result"}),
		heals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_heals_total",
			Help: "Heal calls, by driver and result (healed, failed, error, busy: the driver was busy with the volume, pods_must_restart: repaired on the node, but running pods still see the dead mount).",
		}, []string{"driver", "result"}),
		volumesKept: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_volumes_kept_total",
			Help: "Volumes that restart sweeps found healthy and kept alive by their driver across the node plugin's restart (their mounters run outside the node plugin), so confirmed and not healed, by driver. Beside volume_healer_heals_total{result=\"healed\"}: the restarts a driver's keeping spared a heal.",
		}, []string{"driver"}),
		callDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "volume_healer_call_duration_seconds",
			Help:    "Duration of probe and heal calls to the sidecars, by operation.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}, []string{"operation"}),
		healFailing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "volume_healer_volume_heal_failing",
			Help: "1 for each PVC whose last heal failed; the series goes away when the volume is healthy again.",
		}, []string{"namespace", "persistentvolumeclaim", "driver"}),
		deadMountSince: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "volume_healer_pods_on_dead_mount_since_timestamp_seconds",
			Help: "For each PVC whose volume was repaired on its node while running pods still see its dead mount (StaleMountInPods), when that was first found; the series goes away when the volume is found healthy again.",
		}, []string{"namespace", "persistentvolumeclaim", "driver"}),
		recyclingSince: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "volume_healer_volume_recycling_since_timestamp_seconds",
			Help: "For each PVC whose volume is being recycled on a node (its pods there evicted so that the driver mounts it again), when the recycle began; the series goes away when the volume is found healthy there again, or unstaged with no pod left.",
		}, []string{"namespace", "persistentvolumeclaim", "driver"}),
		callErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_call_errors_total",
			Help: "Failed calls to sidecars, by driver and reason (unreachable, timeout, rejected, busy, not_staged, unsupported, not_found, malformed, other).",
		}, []string{"driver", "reason"}),
	}
	m.restartsPending = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "volume_healer_restart_sweeps_pending",
		Help: "Restart sweeps, by driver, that did not reach every volume of their node (sidecar unreachable, volumes failed) and are being tried again; their restart is not recorded as handled.",
	}, []string{"driver"})
	m.restartRetries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volume_healer_restart_sweep_retries_total",
		Help: "Further tries of incomplete restart sweeps, by driver.",
	}, []string{"driver"})
	m.sweepPanics = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volume_healer_sweep_panics_total",
		Help: "Sweeps that panicked, by trigger; each ended alone, unrecorded, and the controller went on.",
	}, []string{"trigger"})
	m.goroutinePanics = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volume_healer_sweep_goroutine_panics_total",
		Help: "Panics recovered in the goroutines a sweep starts, by goroutine (staged_list: listing one node's staged volumes, which then fails that node; status_write: writing a claim's status annotation or an Event after it, which is then lost); the controller went on.",
	}, []string{"goroutine"})
	m.goroutinePanics.WithLabelValues(goroutineStagedList)
	m.goroutinePanics.WithLabelValues(goroutineStatusWrite)
	m.lastFinished = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "volume_healer_sweep_last_finished_timestamp_seconds",
		Help: "When a sweep of each trigger last finished (Unix time), cancelled sweeps excluded.",
	}, []string{"trigger"})
	m.classFinished = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "volume_healer_scheduled_sweep_last_finished_timestamp_seconds",
		Help: "When the last periodic sweep of each StorageClass finished (Unix time), cancelled sweeps excluded.",
	}, []string{"storageclass"})
	m.leader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "volume_healer_leader",
		Help: "1 on the replica that holds the leader Lease and runs sweeps, 0 on standbys.",
	})
	reg.MustRegister(m.leader, m.lastFinished, m.classFinished, m.callErrors, m.sweepsStarted, m.sweepsFinished, m.sweepDuration, m.decisions, m.probes, m.heals, m.volumesKept, m.callDuration, m.healFailing, m.deadMountSince, m.recyclingSince, m.restartsPending, m.restartRetries, m.sweepPanics, m.goroutinePanics)
	return m
}

// SetLeader records whether this replica leads.
func (m *Metrics) SetLeader(leading bool) {
	if m == nil {
		return
	}
	v := 0.0
	if leading {
		v = 1
	}
	m.leader.Set(v)
}

// sweepFinished records when a sweep that was not cancelled finished: per trigger, and for a
// periodic sweep per StorageClass too.
func (m *Metrics) sweepFinished(sw scheduler.Sweep, at time.Time) {
	if m == nil {
		return
	}
	m.lastFinished.WithLabelValues(string(sw.Trigger)).Set(float64(at.Unix()))
	if sw.Trigger == scheduler.TriggerSchedule && sw.StorageClass != "" {
		m.classFinished.WithLabelValues(sw.StorageClass).Set(float64(at.Unix()))
	}
}

// ForgetStorageClass removes the series of a deleted StorageClass. A periodic sweep of the
// class that was still running when it was deleted sets its series again; without a schedule
// interval for the class the overdue alert ignores it.
func (s *Sweeper) ForgetStorageClass(name string) {
	if m := s.opts.Metrics; m != nil {
		m.classFinished.DeleteLabelValues(name)
	}
}

// startDriver creates a driver's probe, heal and error series at zero the first time the driver is
// seen, so that increase() sees its first failure.
func (m *Metrics) startDriver(driver string) {
	if m == nil {
		return
	}
	if _, seen := m.drivers.LoadOrStore(driver, true); seen {
		return
	}
	for _, r := range []string{"healthy", "unhealthy", "error", "busy"} {
		m.probes.WithLabelValues(driver, r)
	}
	for _, r := range []string{"healed", "failed", "error", "busy", "pods_must_restart"} {
		m.heals.WithLabelValues(driver, r)
	}
	m.volumesKept.WithLabelValues(driver)
	for _, r := range []string{"unreachable", "timeout", "rejected", "busy", "not_staged", "unsupported", "not_found", "malformed", "other"} {
		m.callErrors.WithLabelValues(driver, r)
	}
	m.restartsPending.WithLabelValues(driver)
	m.restartRetries.WithLabelValues(driver)
}

// volumeKept counts a volume of driver that a restart sweep found kept alive and healthy.
func (m *Metrics) volumeKept(driver string) {
	if m == nil {
		return
	}
	m.volumesKept.WithLabelValues(driver).Inc()
}

// restartPending adds delta to the incomplete restart sweeps of driver.
func (m *Metrics) restartPending(driver string, delta float64) {
	if m == nil {
		return
	}
	m.restartsPending.WithLabelValues(driver).Add(delta)
}

// sweepPanicked counts a sweep that panicked.
func (m *Metrics) sweepPanicked(t scheduler.Trigger) {
	if m == nil {
		return
	}
	m.sweepPanics.WithLabelValues(string(t)).Inc()
}

// goroutinePanicked counts a panic recovered in the sweep's goroutine named goroutine.
func (m *Metrics) goroutinePanicked(goroutine string) {
	if m == nil {
		return
	}
	m.goroutinePanics.WithLabelValues(goroutine).Inc()
}

// restartRetried counts a further try of an incomplete restart sweep of driver.
func (m *Metrics) restartRetried(driver string) {
	if m == nil {
		return
	}
	m.restartRetries.WithLabelValues(driver).Inc()
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
		{probe.ErrRejected, "rejected"}, {probe.ErrBusy, "busy"}, {probe.ErrNotStaged, "not_staged"},
		{probe.ErrUnsupported, "unsupported"}, {probe.ErrNotFound, "not_found"}, {probe.ErrMalformed, "malformed"}, {probe.ErrListTooLarge, "malformed"},
	} {
		if errors.Is(err, r.err) {
			return r.reason
		}
	}
	return "other"
}

// podsOnDeadMount records that running pods see the claim's dead mount since at, unless an earlier
// time is recorded already; with on false it drops the claim's series.
func (m *Metrics) podsOnDeadMount(namespace, claim, driver string, on bool, at time.Time) {
	if m == nil {
		return
	}
	key := [3]string{namespace, claim, driver}
	if !on {
		if _, had := m.deadMountSeen.LoadAndDelete(key); had {
			m.deadMountSince.DeleteLabelValues(namespace, claim, driver)
		}
		return
	}
	if _, had := m.deadMountSeen.LoadOrStore(key, true); !had {
		m.deadMountSince.WithLabelValues(namespace, claim, driver).Set(float64(at.UnixNano()) / 1e9)
	}
}

// recycling records that the claim's volume is recycled since at, or that it no longer is.
func (m *Metrics) recycling(namespace, claim, driver string, on bool, at time.Time) {
	if m == nil || claim == "" {
		return
	}
	if !on {
		m.recyclingSince.DeleteLabelValues(namespace, claim, driver)
		return
	}
	m.recyclingSince.WithLabelValues(namespace, claim, driver).Set(float64(at.UnixNano()) / 1e9)
}

// Describe sends the descriptor of the unhealthy-volumes gauge; Sweeper is a prometheus.Collector.
func (s *Sweeper) Describe(ch chan<- *prometheus.Desc) { ch <- unhealthyDesc }

// Collect reports the volumes whose last probe found them unhealthy, by driver and health status,
// computed from what the sweeper remembers when Prometheus scrapes.
func (s *Sweeper) Collect(ch chan<- prometheus.Metric) {
	for k, n := range s.mem.unhealthy() {
		ch <- prometheus.MustNewConstMetric(unhealthyDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
}

var unhealthyDesc = prometheus.NewDesc("volume_healer_volumes_unhealthy",
	"Volumes whose last probe found them unhealthy, by driver and health status (DEGRADED, INACCESSIBLE, DATA_LOSS).",
	[]string{"driver", "status"}, nil)

// observe records how long a call of op (probe or heal) took.
func (s *Sweeper) observe(op string, start time.Time) {
	if m := s.opts.Metrics; m != nil {
		m.callDuration.WithLabelValues(op).Observe(s.opts.Clock.Since(start).Seconds())
	}
}

// count counts a probe or heal of driver by result.
func (s *Sweeper) count(driver string, isProbe bool, result string) {
	m := s.opts.Metrics
	if m == nil {
		return
	}
	if isProbe {
		m.probes.WithLabelValues(driver, result).Inc()
		return
	}
	m.heals.WithLabelValues(driver, result).Inc()
}

// setFailing sets or clears the failing-heal series of the volume's claim; clearing it clears the
// claim's dead-mount series too.
func (s *Sweeper) setFailing(v planner.Volume, failing bool) {
	m := s.opts.Metrics
	claim := v.ClaimName()
	if m == nil || claim.Name == "" {
		return
	}
	if failing {
		m.healFailing.WithLabelValues(claim.Namespace, claim.Name, v.Driver).Set(1)
		return
	}
	m.healFailing.DeleteLabelValues(claim.Namespace, claim.Name, v.Driver)
	m.podsOnDeadMount(claim.Namespace, claim.Name, v.Driver, false, time.Time{})
}
