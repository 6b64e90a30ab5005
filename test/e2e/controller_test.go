package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// raceReport starts the race detector's report of a data race.
const raceReport = "WARNING: DATA RACE"

// controller is the volume-healer controller running as its own process.
type controller struct {
	t       *testing.T
	name    string
	proc    *process
	metrics string // base URL of the metrics endpoint
	health  string // base URL of the health endpoints
}

// controllerSettings are the settings every test's controller starts with, as VOLUME_HEALER_*
// names without the prefix; a test overrides or adds to them.
func (f *fixture) controllerSettings() map[string]string {
	return map[string]string{
		"KUBECONFIG":                 f.s.env.Kubeconfig,
		"SIDECAR_TLS_ENABLED":        "false",
		"SIDECAR_AUTH_TOKEN_FILE":    f.s.tokenFile,
		"LEADER_ELECTION_ENABLED":    "false",
		"LEADER_ELECTION_NAMESPACE":  controllerNamespace,
		"LEADER_ELECTION_LEASE_NAME": f.name,
		"POLICY_NAMESPACE":           f.policyNS,
		"RESTART_DEBOUNCE":           "300ms",
		// Periodic sweeps only where a test asks for them.
		"SCHEDULE_DEFAULT": "",
		"SCHEDULE_STAGGER": "0s",
		"BACKOFF_BASE":     "200ms",
		"BACKOFF_MAX":      "2s",
		"LOG_VERBOSITY":    "2",
	}
}

// startController starts a controller with the fixture's settings overridden by settings, and
// waits until it reports ready. It is stopped when the test ends; a failed test shows the end of
// its log, and a data race it reported fails the test.
func (f *fixture) startController(name string, settings map[string]string) *controller {
	t := f.t
	t.Helper()
	metricsAddr, healthAddr := freeAddr(t), freeAddr(t)
	all := f.controllerSettings()
	all["METRICS_BIND_ADDRESS"] = metricsAddr
	all["HEALTH_BIND_ADDRESS"] = healthAddr
	for k, v := range settings {
		all[k] = v
	}
	// Only these settings reach the controller, not the developer's own VOLUME_HEALER_*.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "VOLUME_HEALER_") {
			env = append(env, kv)
		}
	}
	for k, v := range all {
		env = append(env, "VOLUME_HEALER_"+k+"="+v)
	}
	logPath := filepath.Join(f.s.logDir(t), "controller-"+name+".log")
	proc, err := f.s.procs.start("controller "+name, f.s.bin.controller, nil, env, logPath)
	if err != nil {
		t.Fatal(err)
	}
	c := &controller{t: t, name: name, proc: proc, metrics: "http://" + metricsAddr, health: "http://" + healthAddr}
	t.Cleanup(func() {
		if err := proc.stop(40 * time.Second); err != nil {
			t.Errorf("controller %s: %v", name, err)
		}
		c.checkNoRace()
		if t.Failed() {
			t.Logf("last lines of controller %s's log (%s):\n%s", name, logPath, proc.logTail(60))
		}
	})
	c.waitReady()
	return c
}

// checkNoRace fails the test when the race detector reported a data race in the controller.
func (c *controller) checkNoRace() {
	c.t.Helper()
	if c.proc.logContains(raceReport) {
		c.t.Errorf("the race detector found a data race in controller %s; see %s", c.name, c.proc.logPath)
	}
}

// waitReady waits for /readyz, which the controller answers once its informer caches are synced.
func (c *controller) waitReady() {
	c.t.Helper()
	eventually(c.t, 2*time.Minute, "controller "+c.name+" to be ready", func() (bool, string) {
		if !c.proc.running() {
			c.t.Fatalf("controller %s exited (%s) before it was ready:\n%s", c.name, c.proc.exitStatus(), c.proc.logTail(40))
		}
		resp, err := http.Get(c.health + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK, string(body)
	})
}

// mustRun fails the test when the controller has exited.
func (c *controller) mustRun() {
	c.t.Helper()
	if !c.proc.running() {
		c.t.Fatalf("controller %s exited (%s):\n%s", c.name, c.proc.exitStatus(), c.proc.logTail(40))
	}
}

// scrape reads the controller's /metrics.
func (c *controller) scrape() (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(c.metrics + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("scrape controller %s: %w", c.name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse the metrics of controller %s: %w", c.name, err)
	}
	return fams, nil
}

// metric returns the sum of the series of family name whose labels include want; a family or
// series not exposed yet counts as 0. It fails the test when the controller does not answer.
func (c *controller) metric(name string, want map[string]string) float64 {
	c.t.Helper()
	fams, err := c.scrape()
	if err != nil {
		c.t.Fatal(err)
	}
	return metricSum(fams, name, want)
}

func metricSum(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	fam := fams[name]
	if fam == nil {
		return 0
	}
	sum := 0.0
	for _, m := range fam.GetMetric() {
		if !hasLabels(m, want) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v }) {
			return false
		}
	}
	return true
}

// waitIdle waits until the controller has no call in flight and no task queued: every budget
// slot is back.
func (c *controller) waitIdle(timeout time.Duration) {
	c.t.Helper()
	eventually(c.t, timeout, "controller "+c.name+" to have no call in flight and nothing queued", func() (bool, string) {
		c.mustRun()
		fams, err := c.scrape()
		if err != nil {
			return false, err.Error()
		}
		inFlight := metricSum(fams, "volume_healer_dispatch_in_flight", nil)
		queued := metricSum(fams, "volume_healer_dispatch_queued", nil)
		return inFlight == 0 && queued == 0, fmt.Sprintf("%v in flight, %v queued", inFlight, queued)
	})
}

// goroutines reads go_goroutines.
func (c *controller) goroutines() int {
	c.t.Helper()
	return int(c.metric("go_goroutines", nil))
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return fmt.Sprint(ln.Addr())
}
