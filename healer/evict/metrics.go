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
	// ResultContainersRestarted: the pod's containers were restarted in place through the node's
	// sidecar (restart action restartContainers); no eviction.
	ResultContainersRestarted = "containers_restarted"
	// ResultRestartFailed: the sidecar could not restart the pod's containers in place; the
	// policy was asked again without that remedy.
	ResultRestartFailed = "restart_failed"
)

// Recycle results, the values of the result label of volume_healer_recycles_total.
const (
	// RecycleStarted: a volume's recycle on a node began (Event VolumeRecycling follows with the
	// pods evicted).
	RecycleStarted = "started"
	// RecycleBlocked: a recycle could not go on, a pod using the volume on the node stays (Event
	// VolumeRecycleBlocked); counted once per change of what holds it.
	RecycleBlocked = "blocked"
	// RecycleRecycled: the recycled volume was found healthy on the node, or no longer staged
	// there with no pod left on it (Event VolumeRecycled).
	RecycleRecycled = "recycled"
)

// Metrics are the eviction instruments. A nil *Metrics records nothing.
type Metrics struct {
	evictions *prometheus.CounterVec
	throttled prometheus.Counter
	// goroutinePanics counts panics recovered in the evictor's goroutines, by goroutine.
	goroutinePanics *prometheus.CounterVec
	// recycles counts volume recycles, by result.
	recycles *prometheus.CounterVec
}

// NewMetrics creates the instruments and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "volume_healer_evictions_total",
			Help: "Pod restarts a remedy asked for (pods that still saw a healed volume's dead mount, pods on a recycled volume), by result (evicted; blocked: a PodDisruptionBudget refused it and it is tried again; error; dry_run; left_alone: the policy said leave; policy_failed: the policy failed to decide; containers_restarted: restarted in place through the node's sidecar; restart_failed: the sidecar could not, and the policy was asked again without it).",
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
	m.recycles = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volume_healer_recycles_total",
		Help: "Recycles of volumes on a node (every pod using the volume there evicted, so that the driver mounts it again), by result (started; blocked: a pod stays, held by a PodDisruptionBudget, the policy or the eviction budget; recycled: found healthy again, or unstaged with no pod left).",
	}, []string{"result"})
	reg.MustRegister(m.evictions, m.throttled, m.goroutinePanics, m.recycles)
	for _, r := range []string{RecycleStarted, RecycleBlocked, RecycleRecycled} {
		m.recycles.WithLabelValues(r)
	}
	for _, g := range []string{goroutineWorker, goroutineReprobe} {
		m.goroutinePanics.WithLabelValues(g)
	}
	for _, r := range []string{ResultEvicted, ResultBlocked, ResultError, ResultDryRun, ResultLeftAlone, ResultPolicyFailed, ResultContainersRestarted, ResultRestartFailed} {
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

func (m *Metrics) recycle(result string) {
	if m != nil {
		m.recycles.WithLabelValues(result).Inc()
	}
}
