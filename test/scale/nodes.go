package scale

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/cmd/healer-sidecar/sidecar"
	"github.com/volume-healer/volume-healer/cmd/refdriver/driver"
)

// callStats is the drivers' view of the probe and heal calls of every simulated node together:
// the calls in flight at once across the cluster (bounded by the controller's global budget),
// and the time spent in calls.
type callStats struct {
	// delay is added to every probe and heal, in nanoseconds: the time a real driver spends
	// looking at a mount.
	delay atomic.Int64

	inFlight    atomic.Int64
	maxInFlight atomic.Int64
	calls       atomic.Int64
	probes      atomic.Int64
	heals       atomic.Int64
	callNanos   atomic.Int64
	// firstStart and lastEnd are Unix nanoseconds of the first call's start and the last
	// call's end since reset; zero when none.
	firstStart atomic.Int64
	lastEnd    atomic.Int64
}

func (g *callStats) reset() {
	g.maxInFlight.Store(g.inFlight.Load())
	g.calls.Store(0)
	g.probes.Store(0)
	g.heals.Store(0)
	g.callNanos.Store(0)
	g.firstStart.Store(0)
	g.lastEnd.Store(0)
}

func storeMax(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// nodeCalls is one node's view: calls in flight on the node and on each volume, probes per
// volume, and when the first probe since the last reset arrived.
type nodeCalls struct {
	global *callStats

	mu           sync.Mutex
	inFlight     int
	maxInFlight  int
	perVolume    map[string]int
	maxPerVolume int
	probes       map[string]int
	firstProbe   time.Time
	lastEnd      time.Time
}

func newNodeCalls(g *callStats) *nodeCalls {
	return &nodeCalls{global: g, perVolume: map[string]int{}, probes: map[string]int{}}
}

func (n *nodeCalls) reset() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.maxInFlight = n.inFlight
	n.maxPerVolume = 0
	for _, c := range n.perVolume {
		n.maxPerVolume = max(n.maxPerVolume, c)
	}
	n.probes = map[string]int{}
	n.firstProbe = time.Time{}
	n.lastEnd = time.Time{}
}

// nodeCallsSnapshot is what nodeCalls holds at one moment.
type nodeCallsSnapshot struct {
	maxInFlight, maxPerVolume int
	probed                    int // volumes probed at least once
	probes                    int
	firstProbe, lastEnd       time.Time
}

func (n *nodeCalls) snapshot() nodeCallsSnapshot {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := nodeCallsSnapshot{maxInFlight: n.maxInFlight, maxPerVolume: n.maxPerVolume, probed: len(n.probes), firstProbe: n.firstProbe, lastEnd: n.lastEnd}
	for _, c := range n.probes {
		s.probes += c
	}
	return s
}

// intercept wraps the driver's ProbeVolume and HealVolume: it counts the call in flight on the
// node, on the volume and across nodes, waits the configured delay, then lets the driver answer.
func (n *nodeCalls) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	var vol string
	probe := false
	switch r := req.(type) {
	case *healerv1alpha1.ProbeVolumeRequest:
		vol, probe = r.GetVolumeId(), true
	case *healerv1alpha1.HealVolumeRequest:
		vol = r.GetVolumeId()
	default:
		return handler(ctx, req)
	}
	start := time.Now()
	n.mu.Lock()
	n.inFlight++
	n.maxInFlight = max(n.maxInFlight, n.inFlight)
	n.perVolume[vol]++
	n.maxPerVolume = max(n.maxPerVolume, n.perVolume[vol])
	if probe {
		n.probes[vol]++
		if n.firstProbe.IsZero() {
			n.firstProbe = start
		}
	}
	n.mu.Unlock()
	g := n.global
	storeMax(&g.maxInFlight, g.inFlight.Add(1))
	g.firstStart.CompareAndSwap(0, start.UnixNano())

	if d := time.Duration(g.delay.Load()); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	resp, err := handler(ctx, req)

	end := time.Now()
	g.inFlight.Add(-1)
	g.calls.Add(1)
	if probe {
		g.probes.Add(1)
	} else {
		g.heals.Add(1)
	}
	g.callNanos.Add(int64(end.Sub(start)))
	storeMax(&g.lastEnd, end.UnixNano())
	n.mu.Lock()
	n.inFlight--
	n.lastEnd = later(n.lastEnd, end)
	if n.perVolume[vol]--; n.perVolume[vol] == 0 {
		delete(n.perVolume, vol)
	}
	n.mu.Unlock()
	return resp, err
}

// nodePlugin is one simulated CSI node plugin pod: the reference driver on a UNIX socket, behind
// the real healer sidecar on a loopback port. Both run in the harness's process.
type nodePlugin struct {
	name   string
	c      *cluster
	vols   []volume
	dir    string
	socket string
	port   int
	// stats counts the sidecar's API requests.
	stats *requestStats
	calls *nodeCalls
	log   klog.Logger
	// markerAt is when the apiserver accepted the last restart marker the sidecar wrote, in
	// Unix nanoseconds.
	markerAt atomic.Int64

	mu      sync.Mutex
	starts  int
	drv     *driver.Driver
	sc      *sidecar.Sidecar
	cancel  context.CancelFunc
	stopped chan struct{}
}

func newNodePlugin(c *cluster, name string, vols []volume, calls *callStats, log klog.Logger) (*nodePlugin, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(c.dir, "nodes", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return &nodePlugin{
		name: name, c: c, vols: vols, dir: dir, socket: filepath.Join(dir, "csi-addons.sock"), port: port,
		stats: newRequestStats(), calls: newNodeCalls(calls), log: log.WithValues("simulatedNode", name),
	}, nil
}

// start runs the driver and the sidecar, as a start of the node plugin pod: the sidecar writes
// a new restart marker on the CSIAddonsNode once it can answer. It returns when the marker is
// accepted.
func (p *nodePlugin) start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cancel != nil {
		return fmt.Errorf("node plugin on %s is running", p.name)
	}
	drv, err := driver.New(driver.Options{StateDir: filepath.Join(p.dir, "driver"), DriverName: driverName, NodeID: p.name, SeedVolumes: []string{}})
	if err != nil {
		return err
	}
	if p.starts == 0 {
		for _, v := range p.vols {
			if _, err := drv.Volume(v.handle); err == nil {
				continue
			}
			attrs := p.c.pvTemplates[v.class].Spec.CSI.VolumeAttributes
			if _, err := drv.AddVolume(driver.VolumeSpec{ID: v.handle, Mounter: p.c.mounter(v), VolumeContext: attrs}); err != nil {
				return err
			}
		}
	}
	lis, err := listenUnix(p.socket)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(p.calls.intercept))
	drv.Register(srv)

	p.starts++
	observe := func(k requestKey, resp *http.Response, err error) {
		if err == nil && k.Resource == "csiaddonsnodes" && (k.Verb == "PATCH" || k.Verb == "POST") && resp.StatusCode < 300 {
			p.markerAt.Store(time.Now().UnixNano())
		}
	}
	cfg := p.c.restConfig(p.stats, withLabelSelector("persistentvolumes", nodeLabel+"="+p.name), observe)
	// The sidecar's own client-side rate limit, as it has in a cluster.
	cfg.QPS, cfg.Burst = 0, 0
	var sc *sidecar.Sidecar
	for attempt := 0; ; attempt++ {
		sc, err = sidecar.New(sidecar.Options{
			KubeConfig:     cfg,
			NodeName:       p.name,
			Namespace:      pluginNamespace,
			PodUID:         fmt.Sprintf("%s-start-%d", p.name, p.starts),
			DriverEndpoint: "unix://" + p.socket,
			ListenAddress:  fmt.Sprintf("127.0.0.1:%d", p.port),
			Insecure:       true,
			MetricsAddress: "0",
		})
		if err == nil {
			break
		}
		// Another process took the port while the plugin was down: move, as a pod without host
		// networking would; the sidecar advertises its new endpoint.
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 5 {
			_ = lis.Close()
			return err
		}
		if p.port, err = freePort(); err != nil {
			_ = lis.Close()
			return err
		}
	}
	runCtx, cancel := context.WithCancel(klog.NewContext(ctx, p.log))
	stopped := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(lis) })
	wg.Go(func() {
		if err := sc.Start(runCtx); err != nil {
			p.log.Error(err, "Sidecar stopped with an error")
		}
	})
	wg.Go(func() {
		<-runCtx.Done()
		done := make(chan struct{})
		go func() { srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			srv.Stop()
		}
	})
	go func() { wg.Wait(); close(stopped) }()
	p.drv, p.sc, p.cancel, p.stopped = drv, sc, cancel, stopped

	select {
	case <-sc.Registered():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("sidecar on %s did not register its CSIAddonsNode within 2m", p.name)
	}
}

// stop ends the sidecar and the driver, as a node plugin pod's end would.
func (p *nodePlugin) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cancel == nil {
		return
	}
	p.cancel()
	<-p.stopped
	// The next start loads the driver's volumes from disk, as a new driver process would.
	p.cancel, p.drv, p.sc = nil, nil, nil
}

// restart is a restart of the node plugin pod: a stop and a start.
func (p *nodePlugin) restart(ctx context.Context) error {
	p.stop()
	return p.start(ctx)
}

func (p *nodePlugin) driver() *driver.Driver {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.drv
}

func (p *nodePlugin) markerAccepted() time.Time {
	if n := p.markerAt.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

func listenUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&fs.ModeSocket != 0 {
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return net.Listen("unix", path)
}

// nextPort is where freePort looks next. Ports come from below Linux's ephemeral range
// (32768 and up), so that the many outgoing connections of a run do not take a node plugin's port
// while it restarts.
var nextPort atomic.Int64

// freePort returns a loopback port that nothing listens on now.
func freePort() (int, error) {
	// Runs started at the same time on one machine start at different places.
	nextPort.CompareAndSwap(0, int64(20000+os.Getpid()%8000))
	for range 2000 {
		port := int(nextPort.Add(1))
		if port >= 32768 {
			nextPort.Store(20000)
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		_ = ln.Close()
		return port, nil
	}
	return 0, errors.New("no free loopback port between 20000 and 32767")
}
