package healer

import (
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/yaml"

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
	"volume_healer_volumes_kept_total":                              {dto.MetricType_COUNTER, []string{"driver"}},
	"volume_healer_call_duration_seconds":                           {dto.MetricType_HISTOGRAM, []string{"operation"}},
	"volume_healer_volume_heal_failing":                             {dto.MetricType_GAUGE, []string{"driver", "namespace", "persistentvolumeclaim"}},
	"volume_healer_volumes_unhealthy":                               {dto.MetricType_GAUGE, []string{"driver", "status"}},
	"volume_healer_pods_on_dead_mount_since_timestamp_seconds":      {dto.MetricType_GAUGE, []string{"driver", "namespace", "persistentvolumeclaim"}},
	"volume_healer_call_errors_total":                               {dto.MetricType_COUNTER, []string{"driver", "reason"}},
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
	"volume_healer_sidecar_calls_total":                 {dto.MetricType_COUNTER, []string{"code", "rpc"}},
	"volume_healer_sidecar_call_duration_seconds":       {dto.MetricType_HISTOGRAM, []string{"rpc"}},
	"volume_healer_sidecar_auth_failures_total":         {dto.MetricType_COUNTER, []string{"reason"}},
	"volume_healer_sidecar_driver_errors_total":         {dto.MetricType_COUNTER, []string{"code"}},
	"volume_healer_sidecar_panics_total":                {dto.MetricType_COUNTER, []string{"rpc"}},
	"volume_healer_sidecar_goroutine_panics_total":      {dto.MetricType_COUNTER, []string{"goroutine"}},
	"volume_healer_sidecar_container_restarts_total":    {dto.MetricType_COUNTER, []string{"result"}},
	"volume_healer_sidecar_container_runtime_reachable": {dto.MetricType_GAUGE, nil},
	"volume_healer_build_info":                          {dto.MetricType_GAUGE, []string{"commit", "goversion", "version"}},
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
	// A driver seen once: its probe, heal and call error series start at zero with every result
	// and reason the code can count.
	NewMetrics(reg).startDriver("rbd.csi.ceph.com")
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

// binaries are the programs that expose metrics, each with the prefix its own metrics start with:
// volume_healer_ for the controller, volume_healer_sidecar_ for the healer sidecar, so that a
// metric's name says which program's job to look at. A controller metric never takes the sidecar's
// prefix, even when it counts calls to the sidecars.
var binaries = []struct {
	name, prefix, notPrefix string
	build                   func(prometheus.Registerer) error
	families                map[string]family
}{
	{name: "controller", prefix: "volume_healer_", notPrefix: "volume_healer_sidecar_", build: controllerMetrics, families: controllerFamilies},
	{name: "sidecar", prefix: "volume_healer_sidecar_", build: sidecarMetrics, families: sidecarFamilies},
}

// sharedFamilies are exposed by every binary under one name, told apart by the job.
var sharedFamilies = map[string]bool{"volume_healer_build_info": true}

// nameLabels hold names of things in the cluster or of the build, not values the code picks:
// bounded by the cluster's size (driver, storageclass) or by the gauges that drop their series
// (the per-volume ones), never checked for style.
var nameLabels = map[string]bool{
	"driver": true, "namespace": true, "persistentvolumeclaim": true, "storageclass": true,
	"revision": true, "version": true, "commit": true, "goversion": true,
}

// vocabularyLabels take their values verbatim from a protocol's own vocabulary, which operators
// know from elsewhere: gRPC status code names (OK, Unavailable, as grpc_code of the gRPC
// ecosystem's metrics) and CSI VolumeHealth statuses (INACCESSIBLE, as the driver reports them).
var vocabularyLabels = map[string]*regexp.Regexp{
	"code":   regexp.MustCompile(`^(OK|Canceled|Unknown|InvalidArgument|DeadlineExceeded|NotFound|AlreadyExists|PermissionDenied|ResourceExhausted|FailedPrecondition|Aborted|OutOfRange|Unimplemented|Internal|Unavailable|DataLoss|Unauthenticated|x)$`),
	"status": regexp.MustCompile(`^(DEGRADED|INACCESSIBLE|DATA_LOSS|x)$`),
}

var (
	snakeCase = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	camelCase = regexp.MustCompile(`^[A-Z][a-z0-9]+([A-Z][a-z0-9]+)*$`)
)

// maxLabelValues bounds the values the code starts a label of its own choosing with: more would
// be a sign of an unbounded value (an error message, an object's name) taken for an enumeration.
const maxLabelValues = 16

// TestMetricsNamesAndLabels checks the naming rules of the project that promlint does not know,
// for every metric of every binary: the binary's prefix, snake_case label names, label values the
// code chooses in snake_case and few (or from a protocol's vocabulary), and no per-volume label on
// a series that outlives the volume's trouble.
func TestMetricsNamesAndLabels(t *testing.T) {
	for _, b := range binaries {
		t.Run(b.name, func(t *testing.T) {
			mfs := exposed(t, b.build)
			for _, mf := range mfs {
				name := mf.GetName()
				switch {
				case sharedFamilies[name]:
				case !strings.HasPrefix(name, b.prefix):
					t.Errorf("%s does not start with the %s's prefix %s", name, b.name, b.prefix)
				case b.notPrefix != "" && strings.HasPrefix(name, b.notPrefix):
					t.Errorf("%s of the %s starts with %s, another binary's prefix", name, b.name, b.notPrefix)
				}
				values := map[string]map[string]bool{}
				for _, m := range mf.GetMetric() {
					for _, lp := range m.GetLabel() {
						if values[lp.GetName()] == nil {
							values[lp.GetName()] = map[string]bool{}
						}
						values[lp.GetName()][lp.GetValue()] = true
					}
				}
				for label, vals := range values {
					if !snakeCase.MatchString(label) {
						t.Errorf("%s: label name %q is not snake_case", name, label)
					}
					if slices.Contains(volumeLabels, label) && mf.GetType() != dto.MetricType_GAUGE {
						t.Errorf("%s is a %s with the per-volume label %q: its series would never go away", name, mf.GetType(), label)
					}
					if nameLabels[label] {
						continue
					}
					if len(vals) > maxLabelValues {
						t.Errorf("%s: label %s starts with %d values, more than %d: is it bounded?", name, label, len(vals), maxLabelValues)
					}
					for v := range vals {
						if re, ok := vocabularyLabels[label]; ok {
							if !re.MatchString(v) {
								t.Errorf("%s{%s=%q}: not a value of the %s vocabulary", name, label, v, label)
							}
						} else if !snakeCase.MatchString(v) {
							t.Errorf("%s{%s=%q}: label values the code chooses are snake_case", name, label, v)
						}
					}
				}
			}
			if len(mfs) != len(b.families) {
				t.Errorf("%d families exposed, %d listed", len(mfs), len(b.families))
			}
		})
	}
}

// TestAlertNamesAndMetrics checks deploy/prometheus/rules.yaml (its copies agree, test/deploy
// checks): alert names in CamelCase, every volume_healer_ metric an expression selects exposed by
// one of the binaries, and every value its matchers name for a label the code chooses one the code
// starts that label with, so that renaming a metric or a label value cannot leave an alert
// silently selecting nothing.
func TestAlertNamesAndMetrics(t *testing.T) {
	raw, err := os.ReadFile("../deploy/prometheus/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("deploy/prometheus/rules.yaml: %v", err)
	}
	// The label values each family starts with, across the binaries.
	known := map[string]map[string]map[string]bool{}
	for _, b := range binaries {
		for _, mf := range exposed(t, b.build) {
			byLabel := map[string]map[string]bool{}
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if byLabel[lp.GetName()] == nil {
						byLabel[lp.GetName()] = map[string]bool{}
					}
					byLabel[lp.GetName()][lp.GetValue()] = true
				}
			}
			known[mf.GetName()] = byLabel
		}
	}
	selector := regexp.MustCompile(`\b(volume_healer_[a-z0-9_]+)(\{[^}]*\})?`)
	matcher := regexp.MustCompile(`([a-z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			if !camelCase.MatchString(r.Alert) || !strings.HasPrefix(r.Alert, "Volume") {
				t.Errorf("alert %q: alert names are CamelCase and start with Volume", r.Alert)
			}
			for _, sel := range selector.FindAllStringSubmatch(r.Expr, -1) {
				name := sel[1]
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if base := strings.TrimSuffix(name, suffix); base != name && known[base] != nil {
						name = base
					}
				}
				labels, ok := known[name]
				if !ok {
					t.Errorf("alert %s selects %s, which no binary exposes", r.Alert, sel[1])
					continue
				}
				for _, m := range matcher.FindAllStringSubmatch(sel[2], -1) {
					label, value := m[1], m[3]
					if label == "job" || nameLabels[label] {
						continue
					}
					if labels[label] == nil {
						t.Errorf("alert %s matches %s on label %s, which it does not have", r.Alert, name, label)
						continue
					}
					for _, v := range strings.Split(value, "|") {
						if re, ok := vocabularyLabels[label]; ok {
							if !re.MatchString(v) {
								t.Errorf("alert %s matches %s{%s=%q}, not a value of the %s vocabulary", r.Alert, name, label, v, label)
							}
						} else if !labels[label][v] {
							t.Errorf("alert %s matches %s{%s=%q}, a value the code never gives that label", r.Alert, name, label, v)
						}
					}
				}
			}
		}
	}
	if alerts < 5 {
		t.Errorf("%d alerts read from deploy/prometheus/rules.yaml", alerts)
	}
}
