package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/volume-healer/volume-healer/test/harness"
)

// controllerProcess is the controller running as its own process, built with the harness's
// Profiling flavor. It reaches the apiserver through a loopback proxy that counts its requests,
// so that they can be told apart from the sidecars' and the harness's (apiserver_request_total
// does not say who asked).
type controllerProcess struct {
	*harness.Controller
	// stats counts the controller's API requests, as its proxy saw them.
	stats *requestStats
	// handled holds when the apiserver accepted each CSIAddonsNode's last handled marker, by
	// CSIAddonsNode name.
	handledMu sync.Mutex
	handled   map[string]time.Time
	proxy     *http.Server
}

// controllerSettings are the VOLUME_HEALER_* settings the harness varies.
type controllerSettings struct {
	debounce                   time.Duration
	global, perDriver, perNode int
}

func (s controllerSettings) add(to map[string]string) map[string]string {
	to["RESTART_DEBOUNCE"] = s.debounce.String()
	to["BUDGETS_GLOBAL"] = strconv.Itoa(s.global)
	to["BUDGETS_PER_DRIVER"] = strconv.Itoa(s.perDriver)
	to["BUDGETS_PER_NODE"] = strconv.Itoa(s.perNode)
	return to
}

func startController(ctx context.Context, c *cluster, procs *harness.Processes, bin, name string, s controllerSettings) (*controllerProcess, error) {
	p := &controllerProcess{stats: newRequestStats(), handled: map[string]time.Time{}}
	target, err := url.Parse(c.env.Config.Host)
	if err != nil {
		return nil, err
	}
	proxyLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p.proxy = &http.Server{
		Handler: &httputil.ReverseProxy{
			Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
			Transport:     &countingTransport{base: c.base, stats: p.stats, observe: p.observe},
			FlushInterval: -1,
			ErrorLog:      log.New(io.Discard, "", 0),
		},
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = p.proxy.Serve(proxyLis) }()
	kubeconfig := filepath.Join(c.dir, name+".kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: scale, cluster: {server: "http://%s"}}]
users: [{name: scale, user: {}}]
contexts: [{name: scale, context: {cluster: scale, user: scale}}]
current-context: scale
`, proxyLis.Addr())
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		_ = p.proxy.Close()
		return nil, err
	}
	settings := c.env.ControllerSettings()
	settings["KUBECONFIG"] = kubeconfig
	// One replica: leader election would add a Lease read and write every retry period, which
	// is no part of a sweep.
	settings["LEADER_ELECTION_ENABLED"] = "false"
	// No periodic sweeps: every sweep measured is a restart sweep.
	settings["SCHEDULE_DEFAULT"] = ""
	settings["LOG_VERBOSITY"] = "0"
	p.Controller, err = harness.StartController(procs, harness.ControllerOptions{
		Name: name, Binary: bin, Settings: s.add(settings), LogPath: filepath.Join(c.dir, name+".log"), Profile: true,
	})
	if err != nil {
		_ = p.proxy.Close()
		return nil, err
	}
	// At 300,000 volumes the caches take a minute or two to fill on a busy 2-core machine.
	if err := p.WaitReady(ctx, 10*time.Minute); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// observe records when a handled marker (the controller's only PATCH of a CSIAddonsNode) was
// accepted.
func (p *controllerProcess) observe(k requestKey, resp *http.Response, err error) {
	if err != nil || k != (requestKey{Verb: "PATCH", Resource: "csiaddonsnodes"}) || resp.StatusCode >= 300 {
		return
	}
	name := path.Base(resp.Request.URL.Path)
	p.handledMu.Lock()
	defer p.handledMu.Unlock()
	p.handled[name] = time.Now()
}

// handledAt returns when the handled marker of the CSIAddonsNode was last accepted.
func (p *controllerProcess) handledAt(name string) time.Time {
	p.handledMu.Lock()
	defer p.handledMu.Unlock()
	return p.handled[name]
}

// stop sends SIGTERM and waits for the process, killing it after 40s.
func (p *controllerProcess) stop() {
	_ = p.Stop(40 * time.Second)
	_ = p.proxy.Close()
}

// cpuProfile records a CPU profile of the controller for d into path. It needs a profiling build.
func (p *controllerProcess) cpuProfile(ctx context.Context, d time.Duration, path string) error {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.PprofAddr, int(d.Seconds()))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: d + 30*time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("controller CPU profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("controller CPU profile: %s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// memory samples the controller's resident set size and Go heap in use, a few times a second
// apart, and returns the medians.
func (p *controllerProcess) memory(ctx context.Context, samples int) (rss, anon, heap int64, err error) {
	var rs, as, hs []int64
	for i := range samples {
		if i > 0 {
			select {
			case <-ctx.Done():
				return 0, 0, 0, ctx.Err()
			case <-time.After(time.Second):
			}
		}
		r, err := processMemory(p.Pid())
		if err != nil {
			return 0, 0, 0, err
		}
		m, err := harness.ScrapeMetrics(ctx, p.MetricsAddr)
		if err != nil {
			return 0, 0, 0, err
		}
		if _, ok := m["go_memstats_heap_inuse_bytes"]; !ok {
			return 0, 0, 0, errors.New("controller /metrics has no go_memstats_heap_inuse_bytes")
		}
		rs = append(rs, r.Total)
		as = append(as, r.Anon)
		hs = append(hs, int64(harness.MetricSum(m, "go_memstats_heap_inuse_bytes", nil)))
	}
	return median(rs), median(as), median(hs), nil
}

// memoryLimit returns the controller's Go memory limit (go_gc_gomemlimit_bytes), 0 when it has
// none or does not say.
func (p *controllerProcess) memoryLimit(ctx context.Context) (int64, error) {
	m, err := harness.ScrapeMetrics(ctx, p.MetricsAddr)
	if err != nil {
		return 0, err
	}
	limit := harness.MetricSum(m, "go_gc_gomemlimit_bytes", nil)
	if limit <= 0 || limit >= 1<<62 {
		return 0, nil
	}
	return int64(limit), nil
}

func median(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]int64(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
