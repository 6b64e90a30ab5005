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
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/volume-healer/volume-healer/test/controlplane"
)

// profilingFile is added to the controller's main package when the harness profiles it: it
// serves net/http/pprof on the address in profileAddressEnv. It lives only in the build overlay
// the harness writes, never in the source tree.
const profilingFile = `package main

import (
	"net/http"
	_ "net/http/pprof"
	"os"
)

func init() {
	if addr := os.Getenv("` + profileAddressEnv + `"); addr != "" {
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
}
`

// profileAddressEnv names the variable that turns the profiling endpoint of a profiling build on.
const profileAddressEnv = "SCALE_HARNESS_PPROF_ADDRESS"

// buildController builds the controller binary (without the race detector: it runs as its own
// process and its speed is what is measured). With profiling set, the binary also serves
// net/http/pprof (see profilingFile), through a go build overlay.
func buildController(out string, profiling bool) error {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	args := []string{"build", "-o", out}
	if profiling {
		dir := filepath.Dir(out)
		src := filepath.Join(dir, "zz_scale_pprof.go")
		if err := os.WriteFile(src, []byte(profilingFile), 0o644); err != nil {
			return err
		}
		overlay := fmt.Sprintf(`{"Replace": {%q: %q}}`, filepath.Join(root, "cmd", "volume-healer", "zz_scale_pprof.go"), src)
		overlayPath := filepath.Join(dir, "overlay.json")
		if err := os.WriteFile(overlayPath, []byte(overlay), 0o644); err != nil {
			return err
		}
		args = append(args, "-overlay", overlayPath)
	}
	cmd := exec.Command("go", append(args, "./cmd/volume-healer")...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the controller: %w\n%s", err, b)
	}
	return nil
}

// controllerProcess is the controller running as its own process. It reaches the apiserver
// through a loopback proxy that counts its requests, so that they can be told apart from the
// sidecars' and the harness's (apiserver_request_total does not say who asked).
type controllerProcess struct {
	cmd         *exec.Cmd
	metricsAddr string
	healthAddr  string
	// pprofAddr serves net/http/pprof when the binary was built for profiling.
	pprofAddr string
	logPath   string
	// stats counts the controller's API requests, as its proxy saw them.
	stats *requestStats
	// handled holds when the apiserver accepted each CSIAddonsNode's last handled marker, by
	// CSIAddonsNode name.
	handledMu sync.Mutex
	handled   map[string]time.Time
	proxy     *http.Server
	exited    chan struct{}
	err       error
}

// controllerSettings are the VOLUME_HEALER_* settings the harness varies.
type controllerSettings struct {
	debounce                   time.Duration
	global, perDriver, perNode int
}

func (s controllerSettings) env() []string {
	return []string{
		"VOLUME_HEALER_RESTART_DEBOUNCE=" + s.debounce.String(),
		"VOLUME_HEALER_BUDGETS_GLOBAL=" + strconv.Itoa(s.global),
		"VOLUME_HEALER_BUDGETS_PER_DRIVER=" + strconv.Itoa(s.perDriver),
		"VOLUME_HEALER_BUDGETS_PER_NODE=" + strconv.Itoa(s.perNode),
	}
}

func startController(ctx context.Context, c *cluster, bin, name string, s controllerSettings) (*controllerProcess, error) {
	p := &controllerProcess{stats: newRequestStats(), handled: map[string]time.Time{}, exited: make(chan struct{}), logPath: filepath.Join(c.dir, name+".log")}
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
	metricsPort, err := freePort()
	if err != nil {
		_ = p.proxy.Close()
		return nil, err
	}
	healthPort, err := freePort()
	if err != nil {
		_ = p.proxy.Close()
		return nil, err
	}
	pprofPort, err := freePort()
	if err != nil {
		_ = p.proxy.Close()
		return nil, err
	}
	p.metricsAddr = fmt.Sprintf("127.0.0.1:%d", metricsPort)
	p.healthAddr = fmt.Sprintf("127.0.0.1:%d", healthPort)
	p.pprofAddr = fmt.Sprintf("127.0.0.1:%d", pprofPort)
	logFile, err := os.Create(p.logPath)
	if err != nil {
		_ = p.proxy.Close()
		return nil, err
	}
	p.cmd = exec.Command(bin)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	// The controller dies with the harness, however the harness ends (an interrupted run left
	// controllers behind before).
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.cmd.Env = append(os.Environ(),
		"VOLUME_HEALER_KUBECONFIG="+kubeconfig,
		"VOLUME_HEALER_METRICS_BIND_ADDRESS="+p.metricsAddr,
		"VOLUME_HEALER_HEALTH_BIND_ADDRESS="+p.healthAddr,
		// One replica: leader election would add a Lease read and write every retry period,
		// which is no part of a sweep.
		"VOLUME_HEALER_LEADER_ELECTION_ENABLED=false",
		"VOLUME_HEALER_SIDECAR_TLS_ENABLED=false",
		"VOLUME_HEALER_SIDECAR_AUTH_TOKEN_FILE="+c.tokenFile,
		// No periodic sweeps: every sweep measured is a restart sweep.
		"VOLUME_HEALER_SCHEDULE_DEFAULT=",
		"VOLUME_HEALER_LOG_VERBOSITY=0",
		profileAddressEnv+"="+p.pprofAddr,
	)
	p.cmd.Env = append(p.cmd.Env, s.env()...)
	if err := p.cmd.Start(); err != nil {
		_ = logFile.Close()
		_ = p.proxy.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		_ = logFile.Close()
		close(p.exited)
	}()
	if err := p.waitReady(ctx, 3*time.Minute); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

func (p *controllerProcess) pid() int { return p.cmd.Process.Pid }

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

// waitReady waits until /readyz answers: the informer caches have synced.
func (p *controllerProcess) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	hc := &http.Client{Timeout: 2 * time.Second}
	for {
		select {
		case <-p.exited:
			return fmt.Errorf("controller exited before it was ready: %v (log %s)", p.err, p.logPath)
		default:
		}
		resp, err := hc.Get("http://" + p.healthAddr + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("controller not ready within %s (log %s)", timeout, p.logPath)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop sends SIGTERM and waits for the process, killing it after 40s.
func (p *controllerProcess) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(40 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	_ = p.proxy.Close()
}

// cpuProfile records a CPU profile of the controller for d into path. It needs a profiling build.
func (p *controllerProcess) cpuProfile(ctx context.Context, d time.Duration, path string) error {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.pprofAddr, int(d.Seconds()))
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
		r, err := processMemory(p.pid())
		if err != nil {
			return 0, 0, 0, err
		}
		m, err := controllerMetrics(ctx, p.metricsAddr)
		if err != nil {
			return 0, 0, 0, err
		}
		if _, ok := m["go_memstats_heap_inuse_bytes"]; !ok {
			return 0, 0, 0, errors.New("controller /metrics has no go_memstats_heap_inuse_bytes")
		}
		rs = append(rs, r.Total)
		as = append(as, r.Anon)
		hs = append(hs, int64(metricValue(m, "go_memstats_heap_inuse_bytes")))
	}
	return median(rs), median(as), median(hs), nil
}

func median(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]int64(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
