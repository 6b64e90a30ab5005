package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// controller is the volume-healer controller running as its own process.
type controller struct {
	t       *testing.T
	name    string
	cmd     *exec.Cmd
	logPath string
	metrics string // base URL of the metrics endpoint
	health  string // base URL of the health endpoints
	exited  chan struct{}
}

// startController starts the controller with the test settings below, overridden by env
// (VOLUME_HEALER_* names without the prefix), and waits until it reports ready. It is stopped
// when the test ends; a failed test shows the end of its log.
func startController(t *testing.T, name string, env map[string]string) *controller {
	t.Helper()
	s := requireSuite(t)
	metricsAddr, healthAddr := freeAddr(t), freeAddr(t)
	settings := map[string]string{
		"KUBECONFIG":                s.env.Kubeconfig,
		"METRICS_BIND_ADDRESS":      metricsAddr,
		"HEALTH_BIND_ADDRESS":       healthAddr,
		"SIDECAR_TLS_ENABLED":       "false",
		"SIDECAR_AUTH_TOKEN_FILE":   s.tokenFile,
		"LEADER_ELECTION_ENABLED":   "false",
		"LEADER_ELECTION_NAMESPACE": controllerNamespace,
		"RESTART_DEBOUNCE":          "300ms",
		// Periodic sweeps only where a test asks for them.
		"SCHEDULE_DEFAULT": "",
		"SCHEDULE_STAGGER": "0s",
		"BACKOFF_BASE":     "200ms",
		"LOG_VERBOSITY":    "2",
	}
	for k, v := range env {
		settings[k] = v
	}
	// Only the test's settings reach the controller, not the developer's own VOLUME_HEALER_*.
	var environ []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "VOLUME_HEALER_") {
			environ = append(environ, kv)
		}
	}
	for k, v := range settings {
		environ = append(environ, "VOLUME_HEALER_"+k+"="+v)
	}
	// The suite's folder outlives a failed run, and the log with it.
	logPath := filepath.Join(s.dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(s.controllerBin)
	// The controller dies with the test binary, however it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Env = environ
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start controller %s: %v", name, err)
	}
	c := &controller{t: t, name: name, cmd: cmd, logPath: logPath, metrics: "http://" + metricsAddr, health: "http://" + healthAddr, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = logFile.Close()
		close(c.exited)
	}()
	t.Cleanup(func() {
		c.stop()
		if t.Failed() {
			t.Logf("last lines of controller %s's log (%s):\n%s", name, logPath, c.logTail(80))
		}
	})
	c.waitReady()
	return c
}

// waitReady waits for /readyz, which the controller answers once its informer caches are synced.
func (c *controller) waitReady() {
	c.t.Helper()
	eventually(c.t, time.Minute, "controller "+c.name+" to be ready", func() (bool, string) {
		select {
		case <-c.exited:
			c.t.Fatalf("controller %s exited before it was ready:\n%s", c.name, c.logTail(40))
		default:
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

// stop sends SIGTERM and waits for the controller to exit, killing it after 40s.
func (c *controller) stop() {
	select {
	case <-c.exited:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(40 * time.Second):
		c.t.Errorf("controller %s did not stop within 40s of SIGTERM", c.name)
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// kill ends the controller with SIGKILL: no shutdown, no Lease release, calls cut mid-flight.
func (c *controller) kill() {
	_ = c.cmd.Process.Kill()
	<-c.exited
}

func (c *controller) logTail(n int) string {
	f, err := os.Open(c.logPath)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = f.Close() }()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// scrape reads the controller's /metrics.
func (c *controller) scrape() map[string]*dto.MetricFamily {
	c.t.Helper()
	resp, err := http.Get(c.metrics + "/metrics")
	if err != nil {
		c.t.Fatalf("scrape controller %s: %v", c.name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	fams, err := parseMetrics(resp.Body)
	if err != nil {
		c.t.Fatalf("parse the metrics of controller %s: %v", c.name, err)
	}
	return fams
}

// metricValue returns the value of the series of family name whose labels include want; ok is
// false when there is none.
func metricValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) (value float64, ok bool) {
	fam := fams[name]
	if fam == nil {
		return 0, false
	}
	for _, m := range fam.GetMetric() {
		if !hasLabels(m, want) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		case m.GetUntyped() != nil:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v }) {
			return false
		}
	}
	return true
}

func parseMetrics(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(r)
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
