package harness

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/csi-addons/spec/lib/go/identity"
	"google.golang.org/grpc"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/sidecar"
)

// DriverServerOptions tune ServeDriver.
type DriverServerOptions struct {
	// Interceptors see every call before the driver does.
	Interceptors []grpc.UnaryServerInterceptor
	// Healer, when set, wraps the driver's Healer service, to make it misbehave.
	Healer func(healerv1alpha1.HealerServer) healerv1alpha1.HealerServer
}

// DriverServer serves a reference driver's CSI-Addons services (Identity, Healer) on a UNIX
// socket in this process.
type DriverServer struct {
	srv  *grpc.Server
	done chan struct{}
}

// ServeDriver serves d on the UNIX socket at path, replacing a socket file left there.
func ServeDriver(d *simulated.Driver, path string, o DriverServerOptions) (*DriverServer, error) {
	lis, err := listenUnix(path)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(o.Interceptors...))
	if o.Healer == nil {
		d.Register(srv)
	} else {
		identity.RegisterIdentityServer(srv, d.IdentityServer())
		healerv1alpha1.RegisterHealerServer(srv, o.Healer(d.HealerServer()))
	}
	s := &DriverServer{srv: srv, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		_ = srv.Serve(lis)
	}()
	return s, nil
}

// Stop stops serving: calls in flight get grace to finish (none when 0), then are cut off. The
// socket file goes with the listener.
func (s *DriverServer) Stop(grace time.Duration) {
	if grace > 0 {
		stopped := make(chan struct{})
		go func() { s.srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(grace):
		}
	}
	s.srv.Stop()
	<-s.done
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

// Sidecar is a healer sidecar running in this process.
type Sidecar struct {
	*sidecar.Sidecar
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// StartSidecar builds a sidecar with opts and runs it until Stop or the end of ctx.
func StartSidecar(ctx context.Context, opts sidecar.Options) (*Sidecar, error) {
	sc, err := sidecar.New(opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Sidecar{Sidecar: sc, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.err = sc.Start(ctx)
	}()
	return s, nil
}

// Done is closed once the sidecar has stopped.
func (s *Sidecar) Done() <-chan struct{} { return s.done }

// Err is what the sidecar's Start returned, once Done is closed: nil after a stop through Stop.
func (s *Sidecar) Err() error {
	<-s.done
	return s.err
}

// Stop stops the sidecar and waits up to timeout for it to end. It returns what its Start
// returned.
func (s *Sidecar) Stop(timeout time.Duration) error {
	s.cancel()
	select {
	case <-s.done:
		return s.err
	case <-time.After(timeout):
		return fmt.Errorf("the sidecar did not stop within %s", timeout)
	}
}

// PluginOptions describe a node plugin pod in this process.
type PluginOptions struct {
	// Node is the node's name. Required.
	Node string
	// Driver is the CSI driver's name. Required.
	Driver string
	// Namespace holds the node's CSIAddonsNode. Required.
	Namespace string
	// Kube is the sidecar's client configuration, used as it is. Required.
	Kube *rest.Config
	// Dir holds the driver's state and its socket (in a short temporary folder instead when the
	// path would be too long for a UNIX socket). Required.
	Dir string
	// KeepPort keeps the sidecar's loopback port from start to start (moving to a free one when
	// another process took it meanwhile), as a pod on the host network would; by default each
	// start gets a new port, as a recreated pod gets a new IP, and the controller must follow the
	// endpoint on the CSIAddonsNode.
	KeepPort bool
	// Interceptors see every call before the driver does.
	Interceptors []grpc.UnaryServerInterceptor
	// ShutdownTimeout is the sidecar's. Default: the sidecar's default.
	ShutdownTimeout time.Duration
	// RegisterTimeout bounds how long Start waits for the sidecar to register. Default: 2m.
	RegisterTimeout time.Duration
	// Logger, when set, is the logger of the sidecar and the driver; else klog's global one.
	Logger *klog.Logger
	// VolumeKeeping and KeepMounters make the driver one that keeps the volumes of those
	// mounters alive across the restarts VolumeKeeping names (simulated.Options): it advertises
	// the keeping, and its probes say kept. Default: none, as a driver whose mounters die with
	// its node plugin.
	VolumeKeeping []healerv1alpha1.HealerCapability_VolumeKeeping_Type
	KeepMounters  []string
	// TLS, when set, makes the sidecar serve TLS with the key pair it gives at each start, as a
	// new pod gets a new certificate. Default: no TLS.
	TLS *PluginTLS
}

// PluginTLS is the TLS of a plugin's sidecar.
type PluginTLS struct {
	// ServerName is the sidecar's --tls-server-name (the controller's sidecar.tls.serverName).
	ServerName string
	// KeyPair is called before each start of the sidecar and returns the files of the key pair it
	// serves, for example a certificate obtained by a CertificateSigningRequest of that start's pod.
	KeyPair func(ctx context.Context) (certFile, keyFile string, err error)
}

// Plugin is one simulated node plugin pod in this process: the reference driver serving its
// CSI-Addons socket, and the real healer sidecar in front of it on a loopback port. Each start is
// a start of the pod: a new driver reading its volumes from disk, a new sidecar with a new pod UID,
// which writes a new restart marker on the node's CSIAddonsNode.
type Plugin struct {
	opts     PluginOptions
	stateDir string
	socket   string
	sockDir  string // a temporary folder for the socket, removed by Close

	mu      sync.Mutex
	volumes []simulated.VolumeSpec
	addr    string
	starts  int
	drv     *simulated.Driver
	srv     *DriverServer
	sc      *Sidecar
}

// maxSocketPath keeps a UNIX socket path under the 108 bytes Linux allows.
const maxSocketPath = 100

// NewPlugin returns a plugin that has not started yet.
func NewPlugin(o PluginOptions) (*Plugin, error) {
	if o.RegisterTimeout == 0 {
		o.RegisterTimeout = 2 * time.Minute
	}
	p := &Plugin{opts: o, stateDir: filepath.Join(o.Dir, "driver"), socket: filepath.Join(o.Dir, "csi-addons.sock")}
	if err := os.MkdirAll(p.stateDir, 0o755); err != nil {
		return nil, err
	}
	if len(p.socket) > maxSocketPath {
		dir, err := os.MkdirTemp("", "vh")
		if err != nil {
			return nil, err
		}
		p.sockDir, p.socket = dir, filepath.Join(dir, "csi-addons.sock")
	}
	if o.KeepPort {
		var err error
		if p.addr, err = FreeAddr(); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Node is the plugin's node.
func (p *Plugin) Node() string { return p.opts.Node }

// AddVolumes gives the driver volumes: each start adds those it does not hold yet.
func (p *Plugin) AddVolumes(specs ...simulated.VolumeSpec) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.volumes = append(p.volumes, specs...)
}

// Start starts the driver and the sidecar, and returns once the sidecar has written its restart
// marker on the CSIAddonsNode.
func (p *Plugin) Start(ctx context.Context) error {
	sc, err := p.start(ctx)
	if err != nil {
		return err
	}
	select {
	case <-sc.Registered():
		return nil
	case <-sc.Done():
		return fmt.Errorf("the sidecar on %s stopped before it registered its CSIAddonsNode: %v", p.opts.Node, sc.Err())
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(p.opts.RegisterTimeout):
		return fmt.Errorf("the sidecar on %s did not register its CSIAddonsNode within %s", p.opts.Node, p.opts.RegisterTimeout)
	}
}

func (p *Plugin) start(ctx context.Context) (*Sidecar, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sc != nil {
		return nil, fmt.Errorf("the node plugin on %s started twice", p.opts.Node)
	}
	d, err := simulated.New(simulated.Options{StateDir: p.stateDir, Identity: control.Identity{DriverName: p.opts.Driver, NodeID: p.opts.Node}, SeedVolumes: []string{},
		VolumeKeeping: p.opts.VolumeKeeping, KeepMounters: p.opts.KeepMounters})
	if err != nil {
		return nil, err
	}
	for _, v := range p.volumes {
		if _, err := d.Volume(v.ID); err == nil {
			continue // on disk from an earlier start
		}
		if _, err := d.AddVolume(v); err != nil {
			return nil, err
		}
	}
	srv, err := ServeDriver(d, p.socket, DriverServerOptions{Interceptors: p.opts.Interceptors})
	if err != nil {
		return nil, err
	}
	// The pod lives until Stop, not as long as the caller's context; its logger goes with it.
	runCtx := context.WithoutCancel(ctx)
	if p.opts.Logger != nil {
		runCtx = klog.NewContext(runCtx, *p.opts.Logger)
	}
	p.starts++
	opts := p.sidecarOptions()
	if p.opts.TLS != nil {
		if opts.TLSCertFile, opts.TLSKeyFile, err = p.opts.TLS.KeyPair(ctx); err != nil {
			srv.Stop(0)
			return nil, fmt.Errorf("the sidecar's key pair on %s: %w", p.opts.Node, err)
		}
		opts.Insecure, opts.TLSServerName = false, p.opts.TLS.ServerName
	}
	var sc *Sidecar
	for attempt := 0; ; attempt++ {
		sc, err = StartSidecar(runCtx, opts)
		if err == nil {
			break
		}
		// Another process took the port while the plugin was down: move, and the sidecar
		// advertises its new endpoint.
		if !p.opts.KeepPort || !errors.Is(err, syscall.EADDRINUSE) || attempt == 5 {
			srv.Stop(0)
			return nil, err
		}
		if p.addr, err = FreeAddr(); err != nil {
			srv.Stop(0)
			return nil, err
		}
		opts.ListenAddress = p.addr
	}
	p.drv, p.srv, p.sc = d, srv, sc
	return sc, nil
}

func (p *Plugin) sidecarOptions() sidecar.Options {
	addr := p.addr
	if !p.opts.KeepPort {
		addr = "127.0.0.1:0"
	}
	return sidecar.Options{
		KubeConfig:      p.opts.Kube,
		NodeName:        p.opts.Node,
		Namespace:       p.opts.Namespace,
		PodUID:          fmt.Sprintf("%s-start-%d", p.opts.Node, p.starts),
		DriverEndpoint:  "unix://" + p.socket,
		ListenAddress:   addr,
		Insecure:        true,
		MetricsAddress:  "0",
		ShutdownTimeout: p.opts.ShutdownTimeout,
	}
}

// driverGrace is how long the driver's calls in flight may run once its pod stops.
const driverGrace = 3 * time.Second

// Stop ends the sidecar, then the driver once the sidecar no longer calls it, as a crash or an
// upgrade of the pod would. It returns the sidecar's error, if it failed. Stopping a stopped
// plugin does nothing.
func (p *Plugin) Stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sc == nil {
		return nil
	}
	err := p.sc.Stop(p.opts.ShutdownTimeout + time.Minute)
	p.srv.Stop(driverGrace)
	p.sc, p.srv = nil, nil
	if err != nil {
		return fmt.Errorf("sidecar on %s: %w", p.opts.Node, err)
	}
	return nil
}

// Close stops the plugin and removes its socket's temporary folder.
func (p *Plugin) Close() error {
	err := p.Stop()
	if p.sockDir != "" {
		_ = os.RemoveAll(p.sockDir)
	}
	return err
}

// Driver is the driver of the current (or last) start; nil before the first.
func (p *Plugin) Driver() *simulated.Driver {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.drv
}

// Control reaches the driver of the current (or last) start.
func (p *Plugin) Control() DriverControl { return pluginControl{p} }

type pluginControl struct{ p *Plugin }

func (c pluginControl) Volume(_ context.Context, id string) (simulated.Volume, error) {
	d := c.p.Driver()
	if d == nil {
		return simulated.Volume{}, errNotStarted
	}
	return d.Volume(id)
}

func (c pluginControl) SetCondition(_ context.Context, id string, cond control.Condition, hang time.Duration) (simulated.Volume, error) {
	d := c.p.Driver()
	if d == nil {
		return simulated.Volume{}, errNotStarted
	}
	return d.SetCondition(id, cond, hang)
}
