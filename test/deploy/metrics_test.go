package deploy

import (
	"context"
	"errors"
	"regexp"
	"sort"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/policy/webhook"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler/dispatch"
	"github.com/volume-healer/volume-healer/scheduler/planner"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/test/metricstest"
	"github.com/volume-healer/volume-healer/version"
	"github.com/volume-healer/volume-healer/version/versionmetrics"
)

// metricName matches the volume-healer series a PromQL expression selects.
var metricName = regexp.MustCompile(`\bvolume_healer_[a-z0-9_]+\b`)

// seriesNames returns the series names that the controller and the sidecar expose, histograms
// with their _bucket, _sum and _count series, and the family of each.
func seriesNames(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, build := range []func(prometheus.Registerer) error{
		func(reg prometheus.Registerer) error {
			healer.NewMetrics(reg)
			evict.NewMetrics(reg)
			trigger.NewMetrics(reg)
			dispatch.NewMetrics(reg)
			policy.NewMetrics(reg)
			webhook.NewMetrics(reg)
			return reg.Register(versionmetrics.NewBuildInfo(version.Get()))
		},
		func(reg prometheus.Registerer) error { sidecar.NewMetrics(reg); return nil },
	} {
		r := metricstest.NewRecorder()
		if err := build(r); err != nil {
			t.Fatal(err)
		}
		r.Touch(t)
		mfs, err := r.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			name := mf.GetName()
			out[name] = name
			if mf.GetType() == dto.MetricType_HISTOGRAM {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					out[name+suffix] = name
				}
			}
		}
	}
	// The Sweeper collects the unhealthy volumes from its memory when scraped; an idle one exposes
	// nothing, so its descriptors tell the names.
	for _, name := range describedNames(t, sweeper(t)) {
		out[name] = name
	}
	return out
}

// sweeper returns a Sweeper as the controller registers it, with parts that are never called.
func sweeper(t *testing.T) *healer.Sweeper {
	t.Helper()
	dispatcher, err := dispatch.New(dispatch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := healer.New(healer.Options{
		Planner:    planner.New(planner.Caches{}),
		Policy:     idlePolicy{},
		Sidecars:   probe.New(probe.Options{}),
		Dispatcher: dispatcher,
		Targets:    healer.NewTargetMap(),
		Client:     fake.NewClientBuilder().Build(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// idlePolicy stands in for the policy engine of a sweeper that never sweeps.
type idlePolicy struct{}

func (idlePolicy) Decide(context.Context, *policy.Input) (policy.Decision, error) {
	return policy.Decision{}, errors.New("no policy in this test")
}

// fqName reads the metric name out of a descriptor; Desc has no accessor for it.
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func describedNames(t *testing.T, c prometheus.Collector) []string {
	t.Helper()
	ch := make(chan *prometheus.Desc, 64)
	c.Describe(ch)
	close(ch)
	var out []string
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no metric name in %s", d)
		}
		out = append(out, m[1])
	}
	if len(out) == 0 {
		t.Fatal("the Sweeper describes no metric")
	}
	return out
}

// unknownMetrics returns the volume_healer_ series that exprs select and that nothing exposes.
func unknownMetrics(t *testing.T, exprs []string) []string {
	t.Helper()
	exposed := seriesNames(t)
	var unknown []string
	seen := map[string]bool{}
	for _, e := range exprs {
		for _, name := range metricName.FindAllString(e, -1) {
			if seen[name] {
				continue
			}
			seen[name] = true
			if _, ok := exposed[name]; !ok {
				unknown = append(unknown, name)
			}
		}
	}
	sort.Strings(unknown)
	return unknown
}
