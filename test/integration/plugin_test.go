package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/volume-healer/volume-healer/cmd/healer-sidecar/sidecar"
	"github.com/volume-healer/volume-healer/cmd/refdriver/driver"
)

// plugin is one simulated node: a CSI node plugin pod with the reference driver serving its
// CSI-Addons socket and the healer sidecar in front of it. Each start is a node plugin (re)start:
// a new driver process reading its volumes from disk, a new sidecar writing a new restart marker.
type plugin struct {
	f        *fixture
	node     string
	stateDir string
	socket   string
	// volumes are added to the driver at each start if it does not know them yet.
	volumes []*volume
	// calls sees every ProbeVolume and HealVolume call of every start; shared sees them too, for
	// limits that span nodes.
	calls  *callTracker
	shared []*callTracker

	mu     sync.Mutex
	driver *driver.Driver
	cancel context.CancelFunc
	done   chan struct{}
	starts int
}

// newPlugin creates the Node object and a plugin that has not started yet. shared trackers see the
// plugin's calls along with its own tracker.
func (f *fixture) newPlugin(node string, shared ...*callTracker) *plugin {
	f.t.Helper()
	f.create(nodeObject(node))
	// UNIX socket paths must stay under 108 bytes, which t.TempDir() paths can exceed.
	sockDir, err := os.MkdirTemp("", "vh")
	if err != nil {
		f.t.Fatal(err)
	}
	p := &plugin{
		f: f, node: node,
		stateDir: filepath.Join(f.t.TempDir(), node),
		socket:   filepath.Join(sockDir, "csi-addons.sock"),
		calls:    newCallTracker(),
		shared:   shared,
	}
	f.t.Cleanup(func() {
		p.stop()
		_ = os.RemoveAll(sockDir)
	})
	return p
}

// start starts the driver and the sidecar, and returns once the sidecar has written its restart
// marker on the CSIAddonsNode.
func (p *plugin) start() {
	t := p.f.t
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cancel != nil {
		t.Fatalf("plugin on %s started twice", p.node)
	}
	d, err := driver.New(driver.Options{StateDir: p.stateDir, DriverName: p.f.driver, NodeID: p.node, SeedVolumes: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range p.volumes {
		if _, err := d.Volume(v.handle); err == nil {
			continue // on disk from an earlier start
		}
		if _, err := d.AddVolume(v.spec()); err != nil {
			t.Fatal(err)
		}
	}
	_ = os.Remove(p.socket)
	lis, err := net.Listen("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	// The driver is served with the tracker in front, so that the tests see every call at the
	// moment the driver sees it; the reference driver's own counters see the same calls.
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(trackCalls(append([]*callTracker{p.calls}, p.shared...)...)))
	d.Register(srv)

	p.starts++
	kube := rest.CopyConfig(p.f.s.env.Config)
	kube.UserAgent = "healer-sidecar/" + p.node
	kube.QPS, kube.Burst = -1, 0
	sc, err := sidecar.New(sidecar.Options{
		KubeConfig:     kube,
		NodeName:       p.node,
		Namespace:      p.f.pluginNS,
		PodUID:         fmt.Sprintf("%s-start-%d", p.node, p.starts),
		DriverEndpoint: "unix://" + p.socket,
		// A new port on each start, as a recreated pod gets a new IP: the controller must follow
		// the endpoint on the CSIAddonsNode.
		ListenAddress:   "127.0.0.1:0",
		Insecure:        true,
		MetricsAddress:  "0",
		ShutdownTimeout: 2 * time.Second,
	})
	if err != nil {
		_ = lis.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = srv.Serve(lis)
	}()
	go func() {
		defer wg.Done()
		if err := sc.Start(ctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("sidecar on %s: %v", p.node, err)
		}
		// The driver goes down with its pod, after the sidecar has stopped calling it.
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(3 * time.Second):
			srv.Stop()
			<-stopped
		}
	}()
	go func() { wg.Wait(); close(done) }()
	p.driver, p.cancel, p.done = d, cancel, done

	select {
	case <-sc.Registered():
	case <-done:
		t.Fatalf("plugin on %s stopped before registering its CSIAddonsNode", p.node)
	case <-time.After(30 * time.Second):
		t.Fatalf("the sidecar on %s did not register its CSIAddonsNode within 30s", p.node)
	}
}

// stop ends the sidecar and the driver, as a crash or an upgrade of the pod would.
func (p *plugin) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cancel == nil {
		return
	}
	p.cancel()
	<-p.done
	p.cancel = nil
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

// drv is the driver of the current (or last) start.
func (p *plugin) drv() *driver.Driver {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.driver
}

func (p *plugin) addonsNodeKey() types.NamespacedName {
	return types.NamespacedName{Namespace: p.f.pluginNS, Name: sidecar.DefaultCSIAddonsNodeName(p.node, p.f.driver)}
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
	return append([]time.Time(nil), c.starts[v.handle][rpc]...)
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
