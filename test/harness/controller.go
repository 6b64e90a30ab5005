package harness

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ControllerOptions describe a controller process.
type ControllerOptions struct {
	// Name names the controller in messages. Required.
	Name string
	// Binary is the controller program, as Build returns it. Required.
	Binary string
	// Settings are VOLUME_HEALER_* settings, named without the prefix. Only these reach the
	// controller: the caller's own VOLUME_HEALER_* variables do not. METRICS_BIND_ADDRESS and
	// HEALTH_BIND_ADDRESS default to free loopback addresses.
	Settings map[string]string
	// Args are its command line arguments.
	Args []string
	// LogPath is where its output goes. Required.
	LogPath string
	// Profile serves net/http/pprof on a free loopback address (Controller.PprofAddr); Binary
	// must be a Profiling build.
	Profile bool
}

// Controller is the volume-healer controller running as its own process.
type Controller struct {
	*Process
	// MetricsAddr and HealthAddr are its metrics and health endpoints, host:port.
	MetricsAddr, HealthAddr string
	// PprofAddr serves net/http/pprof when ControllerOptions.Profile asked for it.
	PprofAddr string
}

// StartController starts a controller as a child of ps. It does not wait for it: see WaitReady.
func StartController(ps *Processes, o ControllerOptions) (*Controller, error) {
	settings := map[string]string{}
	for k, v := range o.Settings {
		settings[k] = v
	}
	c := &Controller{MetricsAddr: settings["METRICS_BIND_ADDRESS"], HealthAddr: settings["HEALTH_BIND_ADDRESS"]}
	for _, addr := range []*string{&c.MetricsAddr, &c.HealthAddr} {
		if *addr == "" {
			var err error
			if *addr, err = FreeAddr(); err != nil {
				return nil, err
			}
		}
	}
	settings["METRICS_BIND_ADDRESS"], settings["HEALTH_BIND_ADDRESS"] = c.MetricsAddr, c.HealthAddr
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "VOLUME_HEALER_") {
			env = append(env, kv)
		}
	}
	for k, v := range settings {
		env = append(env, "VOLUME_HEALER_"+k+"="+v)
	}
	if o.Profile {
		var err error
		if c.PprofAddr, err = FreeAddr(); err != nil {
			return nil, err
		}
		env = append(env, ProfileAddressEnv+"="+c.PprofAddr)
	}
	p, err := ps.Start(o.Name, o.Binary, o.Args, env, o.LogPath)
	if err != nil {
		return nil, err
	}
	c.Process = p
	return c, nil
}

// WaitReady waits until the controller answers /readyz, which it does once its informer caches
// have synced. It gives up when the controller exits, with the end of its log.
func (c *Controller) WaitReady(ctx context.Context, timeout time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	exited := false
	err := WaitFor(ctx, timeout, c.Name+" to be ready", func() (bool, string) {
		if !c.Running() {
			exited = true
			return true, "exited"
		}
		resp, err := hc.Get("http://" + c.HealthAddr + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK, string(body)
	})
	if exited {
		return fmt.Errorf("%s exited (%s) before it was ready:\n%s", c.Name, c.ExitStatus(), c.LogTail(40))
	}
	if err != nil {
		return fmt.Errorf("%w (log %s)", err, c.LogPath)
	}
	return nil
}

// RaceReported tells whether the race detector reported a data race in the controller's log.
func (c *Controller) RaceReported() bool { return c.LogContains(RaceReport) }

// Scrape reads the controller's /metrics.
func (c *Controller) Scrape(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	fams, err := ScrapeMetrics(ctx, c.MetricsAddr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Name, err)
	}
	return fams, nil
}

// ScrapeMetrics reads the Prometheus metrics served at http://addr/metrics.
func ScrapeMetrics(ctx context.Context, addr string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape /metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape /metrics: %s", resp.Status)
	}
	fams, err := ParseMetrics(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse /metrics: %w", err)
	}
	return fams, nil
}

// ParseMetrics reads a Prometheus text exposition.
func ParseMetrics(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(r)
}

// MetricValue returns the value of the first series of counter, gauge or untyped family name
// whose labels include want; ok is false when there is none.
func MetricValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) (value float64, ok bool) {
	for _, m := range fams[name].GetMetric() {
		if v, isValue := seriesValue(m); isValue && HasLabels(m, want) {
			return v, true
		}
	}
	return 0, false
}

// MetricSum returns the sum of the series of counter, gauge or untyped family name whose labels
// include want; a family or series not exposed counts as 0.
func MetricSum(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	sum := 0.0
	for _, m := range fams[name].GetMetric() {
		if v, ok := seriesValue(m); ok && HasLabels(m, want) {
			sum += v
		}
	}
	return sum
}

// HistogramSums returns the sample count and sum of the series of histogram family name whose
// labels include want.
func HistogramSums(fams map[string]*dto.MetricFamily, name string, want map[string]string) (count uint64, sum float64) {
	for _, m := range fams[name].GetMetric() {
		if m.GetHistogram() != nil && HasLabels(m, want) {
			count += m.GetHistogram().GetSampleCount()
			sum += m.GetHistogram().GetSampleSum()
		}
	}
	return count, sum
}

func seriesValue(m *dto.Metric) (float64, bool) {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue(), true
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue(), true
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue(), true
	}
	return 0, false
}

// HasLabels tells whether the series carries every label of want with its value.
func HasLabels(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v }) {
			return false
		}
	}
	return true
}
