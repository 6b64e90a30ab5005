package integration

import (
	"context"
	"path"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"k8s.io/client-go/rest"

	"github.com/volume-healer/volume-healer/test/harness"
)

// plugin is one simulated node: a node plugin pod in the test process (see harness.Plugin) whose
// driver is served with call trackers in front.
type plugin struct {
	*harness.Plugin
	f *fixture
	// volumes are the node's volumes, which its driver gets at each start if it does not hold them.
	volumes []*volume
	// calls sees every ProbeVolume and HealVolume call of every start; the shared trackers given
	// to newPlugin see them too, for limits that span nodes.
	calls *callTracker
}

// newPlugin creates the Node object and a plugin that has not started yet. shared trackers see the
// plugin's calls along with its own tracker.
func (f *fixture) newPlugin(node string, shared ...*callTracker) *plugin {
	f.t.Helper()
	return f.newPluginWith(node, nil, shared...)
}

// newPluginWith is newPlugin with the plugin's options changed by opts first, when it is set.
func (f *fixture) newPluginWith(node string, opts func(*harness.PluginOptions), shared ...*callTracker) *plugin {
	f.t.Helper()
	f.CreateNode(node)
	calls := newCallTracker()
	kube := rest.CopyConfig(f.s.Config)
	kube.UserAgent = "healer-sidecar/" + node
	kube.QPS, kube.Burst = -1, 0
	o := harness.PluginOptions{
		Node: node, Driver: f.Driver, Namespace: f.PluginNS, Kube: kube,
		Dir: filepath.Join(f.t.TempDir(), node),
		// The driver is served with the trackers in front, so that the tests see every call at
		// the moment the driver sees it; the reference driver's own counters see the same calls.
		Interceptors:    []grpc.UnaryServerInterceptor{trackCalls(append([]*callTracker{calls}, shared...)...)},
		ShutdownTimeout: 2 * time.Second,
		RegisterTimeout: 30 * time.Second,
	}
	if opts != nil {
		opts(&o)
	}
	hp, err := harness.NewPlugin(o)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		if err := hp.Close(); err != nil {
			f.t.Error(err)
		}
	})
	return &plugin{Plugin: hp, f: f, calls: calls}
}

// start starts the driver and the sidecar, and returns once the sidecar has written its restart
// marker on the CSIAddonsNode.
func (p *plugin) start() {
	p.f.t.Helper()
	if err := p.Start(p.f.Ctx()); err != nil {
		p.f.t.Fatal(err)
	}
}

// stop ends the sidecar and the driver, as a crash or an upgrade of the pod would.
func (p *plugin) stop() {
	p.f.t.Helper()
	if err := p.Stop(); err != nil {
		p.f.t.Error(err)
	}
}

// restart stops the plugin, lets change break volumes while it is down, and starts it again.
func (p *plugin) restart(change func()) {
	p.f.t.Helper()
	p.stop()
	if change != nil {
		change()
	}
	p.start()
}

// callTracker records the ProbeVolume and HealVolume calls a driver serves: how many run at once
// (in all, and per volume) and when each began.
type callTracker struct {
	mu           sync.Mutex
	inFlight     int
	maxInFlight  int
	perVolume    map[string]int
	maxPerVolume map[string]int
	starts       map[string]map[string][]time.Time // volume ID -> RPC -> start times
}

func newCallTracker() *callTracker {
	return &callTracker{perVolume: map[string]int{}, maxPerVolume: map[string]int{}, starts: map[string]map[string][]time.Time{}}
}

// trackCalls is a gRPC interceptor that reports each volume call to every tracker.
func trackCalls(trackers ...*callTracker) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		rpc := path.Base(info.FullMethod)
		withID, ok := req.(interface{ GetVolumeId() string })
		if !ok || (rpc != "ProbeVolume" && rpc != "HealVolume") {
			return handler(ctx, req)
		}
		now := time.Now()
		for _, tr := range trackers {
			tr.enter(rpc, withID.GetVolumeId(), now)
		}
		defer func() {
			for _, tr := range trackers {
				tr.leave(withID.GetVolumeId())
			}
		}()
		return handler(ctx, req)
	}
}

func (c *callTracker) enter(rpc, id string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inFlight++
	c.maxInFlight = max(c.maxInFlight, c.inFlight)
	c.perVolume[id]++
	c.maxPerVolume[id] = max(c.maxPerVolume[id], c.perVolume[id])
	if c.starts[id] == nil {
		c.starts[id] = map[string][]time.Time{}
	}
	c.starts[id][rpc] = append(c.starts[id][rpc], at)
}

func (c *callTracker) leave(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inFlight--
	c.perVolume[id]--
}

// peaks returns the most calls seen at once, in all and on any one volume.
func (c *callTracker) peaks() (all, perVolume int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.maxPerVolume {
		perVolume = max(perVolume, n)
	}
	return c.maxInFlight, perVolume
}

// callTimes returns when the calls of rpc on the volume began.
func (c *callTracker) callTimes(v *volume, rpc string) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.starts[v.Handle][rpc]...)
}

// count returns the number of calls of rpc on the volume; after a non-zero since, only those
// that began after it.
func (c *callTracker) count(v *volume, rpc string, since time.Time) int {
	n := 0
	for _, at := range c.callTimes(v, rpc) {
		if at.After(since) {
			n++
		}
	}
	return n
}

// total returns the number of calls of rpc on all volumes.
func (c *callTracker) total(rpc string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, byRPC := range c.starts {
		n += len(byRPC[rpc])
	}
	return n
}
