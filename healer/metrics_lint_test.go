package healer

import (
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/volume-healer/volume-healer/admission/propagation"
	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/policy/webhook"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler/dispatch"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/test/metricstest"
	"github.com/volume-healer/volume-healer/version"
	"github.com/volume-healer/volume-healer/version/versionmetrics"
)

// family is what a dashboard or an alert relies on: a metric's type and its label names.
type family struct {
	typ    dto.MetricType
	labels []string
}

// controllerFamilies are the metrics the controller exposes besides the Go and process
// collectors. deploy/prometheus/rules.yaml, the dashboard and docs/operations.md use these names;
// renaming one, or changing its labels, breaks them.
var controllerFamilies = map[string]family{
	"volume_healer_sweeps_started_total":                            {dto.MetricType_COUNTER, []string{"trigger"}},
	"volume_healer_sweeps_finished_total":                           {dto.MetricType_COUNTER, []string{"result", "trigger"}},
	"volume_healer_sweep_duration_seconds":                          {dto.MetricType_HISTOGRAM, []string{"trigger"}},
	"volume_healer_sweep_decisions_total":                           {dto.MetricType_COUNTER, []string{"action", "trigger"}},
	"volume_healer_probes_total":                                    {dto.MetricType_COUNTER, []string{"driver", "result"}},
	"volume_healer_heals_total":                                     {dto.MetricType_COUNTER, []string{"driver", "result"}},
	"volume_healer_call_duration_seconds":                           {dto.MetricType_HISTOGRAM, []string{"operation"}},
	"volume_healer_volume_heal_failing":                             {dto.MetricType_GAUGE, []string{"driver", "namespace", "persistentvolumeclaim"}},
	"volume_healer_volumes_unhealthy":                               {dto.MetricType_GAUGE, []string{"driver", "status"}},
	"volume_healer_pods_on_dead_mount_since_timestamp_seconds":      {dto.MetricType_GAUGE, []string{"driver", "namespace", "persistentvolumeclaim"}},
	"volume_healer_sidecar_call_errors_total":                       {dto.MetricType_COUNTER, []string{"driver", "reason"}},
	"volume_healer_restart_sweeps_pending":                          {dto.MetricType_GAUGE, []string{"driver"}},
	"volume_healer_restart_sweep_retries_total":                     {dto.MetricType_COUNTER, []string{"driver"}},
	"volume_healer_sweep_panics_total":                              {dto.MetricType_COUNTER, []string{"trigger"}},
	"volume_healer_sweep_goroutine_panics_total":                    {dto.MetricType_COUNTER, []string{"goroutine"}},
	"volume_healer_scheduler_schedule_errors_total":                 {dto.MetricType_COUNTER, nil},
	"volume_healer_scheduler_schedule_invalid":                      {dto.MetricType_GAUGE, []string{"storageclass"}},
	"volume_healer_scheduler_triggers_total":                        {dto.MetricType_COUNTER, []string{"trigger"}},
	"volume_healer_dispatch_in_flight":                              {dto.MetricType_GAUGE, []string{"driver"}},
	"volume_healer_dispatch_queued":                                 {dto.MetricType_GAUGE, nil},
	"volume_healer_dispatch_task_panics_total":                      {dto.MetricType_COUNTER, nil},
	"volume_healer_dispatch_budget_wait_seconds":                    {dto.MetricType_HISTOGRAM, []string{"trigger"}},
	"volume_healer_dispatch_retries_total":                          {dto.MetricType_COUNTER, []string{"reason"}},
	"volume_healer_dispatch_given_up_total":                         {dto.MetricType_COUNTER, nil},
	"volume_healer_policy_rejected":                                 {dto.MetricType_GAUGE, nil},
	"volume_healer_leader":                                          {dto.MetricType_GAUGE, nil},
	"volume_healer_dispatch_budget":                                 {dto.MetricType_GAUGE, []string{"scope"}},
	"volume_healer_sweep_last_finished_timestamp_seconds":           {dto.MetricType_GAUGE, []string{"trigger"}},
	"volume_healer_scheduled_sweep_last_finished_timestamp_seconds": {dto.MetricType_GAUGE, []string{"storageclass"}},
	"volume_healer_schedule_interval_seconds":                       {dto.MetricType_GAUGE, []string{"storageclass"}},
	"volume_healer_policy_evaluation_duration_seconds":              {dto.MetricType_HISTOGRAM, nil},
	"volume_healer_policy_evaluation_errors_total":                  {dto.MetricType_COUNTER, []string{"reason"}},
	"volume_healer_policy_load_errors_total":                        {dto.MetricType_COUNTER, []string{"reason"}},
	"volume_healer_policy_revision_info":                            {dto.MetricType_GAUGE, []string{"revision"}},
	"volume_healer_policy_memo_lookups_total":                       {dto.MetricType_COUNTER, []string{"result"}},
	"volume_healer_policy_decisions_total":                          {dto.MetricType_COUNTER, []string{"action"}},
	"volume_healer_webhook_reviews_total":                           {dto.MetricType_COUNTER, []string{"result"}},
	"volume_healer_webhook_review_duration_seconds":                 {dto.MetricType_HISTOGRAM, nil},
	"volume_healer_propagation_webhook_requests_total":              {dto.MetricType_COUNTER, []string{"result"}},
	"volume_healer_propagation_webhook_request_duration_seconds":    {dto.MetricType_HISTOGRAM, nil},
	"volume_healer_build_info":                                      {dto.MetricType_GAUGE, []string{"commit", "goversion", "version"}},
	"volume_healer_evictions_total":                                 {dto.MetricType_COUNTER, []string{"result"}},
	"volume_healer_evictions_throttled_total":                       {dto.MetricType_COUNTER, nil},
	"volume_healer_recycles_total":                                  {dto.MetricType_COUNTER, []string{"result"}},
	"volume_healer_volume_recycling_since_timestamp_seconds":        {dto.MetricType_GAUGE, []string{"driver", "namespace", "persistentvolumeclaim"}},
	"volume_healer_evictions_goroutine_panics_total":                {dto.MetricType_COUNTER, []string{"goroutine"}},
}

// sidecarFamilies are the metrics of the healer sidecar besides the Go and process collectors.
var sidecarFamilies = map[string]family{
	"volume_healer_sidecar_calls_total":            {dto.MetricType_COUNTER, []string{"code", "rpc"}},
	"volume_healer_sidecar_call_duration_seconds":  {dto.MetricType_HISTOGRAM, []string{"rpc"}},
	"volume_healer_sidecar_auth_failures_total":    {dto.MetricType_COUNTER, []string{"reason"}},
	"volume_healer_sidecar_driver_errors_total":    {dto.MetricType_COUNTER, []string{"code"}},
	"volume_healer_sidecar_panics_total":           {dto.MetricType_COUNTER, []string{"rpc"}},
	"volume_healer_sidecar_goroutine_panics_total": {dto.MetricType_COUNTER, []string{"goroutine"}},
	"volume_healer_build_info":                     {dto.MetricType_GAUGE, []string{"commit", "goversion", "version"}},
}

// volumeLabels name one volume. They are unbounded over the life of a cluster, so only gauges that
// hold failing volumes alone may carry them (the way kubelet's per-PVC health gauge does), never
// a counter or a histogram, whose series live until the process ends.
var volumeLabels = []string{"persistentvolumeclaim", "persistentvolume", "pv", "pvc", "volume", "volume_handle"}

// exposed builds instruments on a fresh registry with build, touches every vector and returns
// what the registry exposes.
func exposed(t *testing.T, build func(prometheus.Registerer) error) []*dto.MetricFamily {
	t.Helper()
	r := metricstest.NewRecorder()
	if err := build(r); err != nil {
		t.Fatal(err)
	}
	r.Touch(t)
	mfs, err := r.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// controllerMetrics registers the controller's instruments on reg as cmd/volume-healer wires
// them (the webhook's with webhook.enabled), with the Sweeper as the collector of the unhealthy volumes. That gauge is computed from
// the sweeper's memory at scrape time, so one volume is remembered unhealthy for it to show.
func controllerMetrics(reg prometheus.Registerer) error {
	NewMetrics(reg)
	evict.NewMetrics(reg)
	trigger.NewMetrics(reg)
	dispatch.NewMetrics(reg)
	policy.NewMetrics(reg)
	webhook.NewMetrics(reg)
	propagation.NewMetrics(reg)
	reg.MustRegister(versionmetrics.NewBuildInfo(version.Get()))
	s := &Sweeper{mem: newMemory()}
	s.mem.recordProbe("pv-1", "node-a", "rbd.csi.ceph.com", time.Now(), &probe.Result{Health: []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}}, 0)
	return reg.Register(s)
}

func sidecarMetrics(reg prometheus.Registerer) error {
	sidecar.NewMetrics(reg)
	return nil
}

func TestMetricsLint(t *testing.T) {
	tests := map[string]struct {
		build func(prometheus.Registerer) error
		want  map[string]family
	}{
		"controller": {build: controllerMetrics, want: controllerFamilies},
		"sidecar":    {build: sidecarMetrics, want: sidecarFamilies},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			mfs := exposed(t, tc.build)

			problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range problems {
				t.Errorf("promlint: %s: %s", p.Metric, p.Text)
			}

			got := map[string]family{}
			for _, mf := range mfs {
				var labels []string
				for _, lp := range mf.GetMetric()[0].GetLabel() {
					labels = append(labels, lp.GetName())
				}
				sort.Strings(labels)
				got[mf.GetName()] = family{typ: mf.GetType(), labels: labels}
			}
			for n, w := range tc.want {
				g, ok := got[n]
				switch {
				case !ok:
					t.Errorf("%s is not exposed", n)
				case g.typ != w.typ:
					t.Errorf("%s is a %s, want a %s", n, g.typ, w.typ)
				case !slices.Equal(g.labels, w.labels):
					t.Errorf("%s has labels %v, want %v", n, g.labels, w.labels)
				}
			}
			for n := range got {
				if _, ok := tc.want[n]; !ok {
					t.Errorf("%s is exposed but not listed here: add it, with its type and labels, and document it in docs/operations.md", n)
				}
			}
		})
	}
}

// TestMetricsNamesAndLabels checks the naming rules of the project that promlint does not know:
// one prefix, and no per-volume label on a series that outlives the volume's trouble.
func TestMetricsNamesAndLabels(t *testing.T) {
	var mfs []*dto.MetricFamily
	for _, build := range []func(prometheus.Registerer) error{controllerMetrics, sidecarMetrics} {
		mfs = append(mfs, exposed(t, build)...)
	}
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "volume_healer_") {
			t.Errorf("%s does not start with volume_healer_", name)
		}
		for _, lp := range mf.GetMetric()[0].GetLabel() {
			if slices.Contains(volumeLabels, lp.GetName()) && mf.GetType() != dto.MetricType_GAUGE {
				t.Errorf("%s is a %s with the per-volume label %q: its series would never go away", name, mf.GetType(), lp.GetName())
			}
		}
	}
	if len(mfs) != len(controllerFamilies)+len(sidecarFamilies) {
		t.Errorf("%d families exposed, %d listed", len(mfs), len(controllerFamilies)+len(sidecarFamilies))
	}
}
