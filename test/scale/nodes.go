package scale

import (
	"context"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/test/harness"
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

// nodePlugin is one simulated CSI node plugin pod in the harness's process (see
// harness.Plugin), whose driver counts its calls and whose sidecar's API requests are counted.
type nodePlugin struct {
	*harness.Plugin
	name string
	vols []volume
	// stats counts the sidecar's API requests.
	stats *requestStats
	calls *nodeCalls
	log   klog.Logger
	// markerAt is when the apiserver accepted the last restart marker the sidecar wrote, in
	// Unix nanoseconds.
	markerAt atomic.Int64
}

func newNodePlugin(c *cluster, name string, vols []volume, calls *callStats, log klog.Logger) (*nodePlugin, error) {
	p := &nodePlugin{name: name, vols: vols, stats: newRequestStats(), calls: newNodeCalls(calls), log: log.WithValues("simulatedNode", name)}
	observe := func(k requestKey, resp *http.Response, err error) {
		if err == nil && k.Resource == "csiaddonsnodes" && (k.Verb == "PATCH" || k.Verb == "POST") && resp.StatusCode < 300 {
			p.markerAt.Store(time.Now().UnixNano())
		}
	}
	cfg := c.restConfig(p.stats, nil, observe)
	// The sidecar's own client-side rate limit, as it has in a cluster.
	cfg.QPS, cfg.Burst = 0, 0
	hp, err := harness.NewPlugin(harness.PluginOptions{
		Node: name, Driver: driverName, Namespace: pluginNamespace, Kube: cfg,
		Dir:          filepath.Join(c.dir, "nodes", name),
		KeepPort:     true,
		Interceptors: []grpc.UnaryServerInterceptor{p.calls.intercept},
		Logger:       &p.log,
	})
	if err != nil {
		return nil, err
	}
	specs := make([]simulated.VolumeSpec, len(vols))
	for i, v := range vols {
		specs[i] = simulated.VolumeSpec{ID: v.handle, Mounter: c.mounter(v), VolumeContext: c.pvTemplates[v.class].Spec.CSI.VolumeAttributes}
	}
	hp.AddVolumes(specs...)
	p.Plugin = hp
	return p, nil
}

// start runs the driver and the sidecar, as a start of the node plugin pod: the sidecar writes
// a new restart marker on the CSIAddonsNode once it can answer. It returns when the marker is
// accepted.
func (p *nodePlugin) start(ctx context.Context) error { return p.Start(ctx) }

// stop ends the sidecar and the driver, as a node plugin pod's end would.
func (p *nodePlugin) stop() {
	if err := p.Stop(); err != nil {
		p.log.Error(err, "Sidecar stopped with an error")
	}
}

// restart is a restart of the node plugin pod: a stop and a start.
func (p *nodePlugin) restart(ctx context.Context) error {
	p.stop()
	return p.start(ctx)
}

func (p *nodePlugin) markerAccepted() time.Time {
	if n := p.markerAt.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}
