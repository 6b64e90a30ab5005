// Package sidecar is the volume-healer sidecar: it runs in a CSI node plugin pod, serves the
// NodeHealer service to the volume-healer controller over TCP with TLS, and relays each call to
// the driver's Healer service on the driver's CSI-Addons UNIX socket. A driver with no CSI-Addons
// socket is known by its CSI socket (its name from CSI GetPluginInfo) or by its name alone, and
// served by the sidecar's own probe.
//
// For each call it first authenticates the caller (a TokenReview of the ServiceAccount token in
// the "authorization" metadata, cached briefly), before it reads the request; then it takes the
// PersistentVolume's facts (volume handle, volume context, what the staging path and the volume
// capability need, the node-stage Secret's reference) from the request, or reads the PV when an
// older caller sent none; checks from its node's own truth that the volume is on its node (the
// Node's status.volumesAttached, watched as one object; kubelet's records; the driver's staged
// list); reads the node-stage Secret where the call needs it; and calls the driver with a bounded
// timeout. For a driver that does not probe or list its volumes
// (no Healer service, or no PROBE or LIST_VOLUMES), the sidecar does so itself from kubelet's
// records on its node (package nodeprobe), and says so in its answers. Given the node's container
// runtime socket, it serves RestartContainers itself, without the driver: it stops the containers
// of a pod that mount a volume's publish target, for kubelet to start them again (package
// restart). On every start it writes a fresh restart marker on the node's CSIAddonsNode, so that
// the controller sweeps the node's volumes.
//
// The package holds no global state: a test or a scale harness can run many sidecars in one
// process, each with its own Options.
//
// It is the node side of the pipeline and is linked into the sidecar binary only: it must not
// import the controller's packages (scheduler, policy, probe, healer), so that the sidecar does
// not carry the policy engine.
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/sidecar/nodeprobe"
	"github.com/volume-healer/volume-healer/sidecar/restart"
)

// Sidecar is one running sidecar. Create it with New, run it with Start.
type Sidecar struct {
	opts    Options
	metrics *Metrics
	driver  *driverClient
	volumes *volumes
	// attachments watches the node's status.volumesAttached.
	attachments *nodeAttachments
	healer      *nodeHealer
	// runtime is the node's container runtime, for RestartContainers; nil without
	// ContainerRuntimeEndpoint.
	runtime *restart.Runtime
	auth    *authenticator
	reg     *registrar
	// keys is the serving certificate; nil with Insecure.
	keys *keyPair

	grpc       *grpc.Server
	lis        net.Listener
	http       *http.Server
	metricsLis net.Listener

	// log is Start's logger, for the calls, whose contexts do not derive from Start's.
	log klog.Logger

	registeredOnce sync.Once
	registered     chan struct{}
	// driverRestarted holds one pending "the driver restarted" for register.
	driverRestarted chan struct{}
}

// New builds a sidecar and opens its listeners, so that Addr and MetricsAddr are known before
// Start. Start must be called (with a context that ends) to serve and to release them.
func New(opts Options) (*Sidecar, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	s := &Sidecar{opts: opts, log: klog.Background().WithValues("node", opts.NodeName), metrics: NewMetrics(opts.Registry), registered: make(chan struct{}), driverRestarted: make(chan struct{}, 1)}

	kubeCfg := rest.CopyConfig(opts.KubeConfig)
	if kubeCfg.QPS == 0 && kubeCfg.Burst == 0 {
		// A call of an older controller reads its PV and VolumeAttachment, and each heal its
		// Secret: client-go's default pace (5 requests a second) would pace the node's restart
		// sweep instead of the controller's budgets.
		kubeCfg.QPS, kubeCfg.Burst = DefaultAPIQPS, DefaultAPIBurst
	}
	if kubeCfg.ContentType == "" {
		// The kinds this client reads and writes (PVs, VolumeAttachments, Secrets, TokenReviews)
		// are built in, and the API server speaks protobuf for them: cheaper than JSON to encode
		// and decode, at both ends, for the reads every call and every start make.
		kubeCfg.ContentType = runtime.ContentTypeProtobuf
		kubeCfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	}
	kube, err := kubernetes.NewForConfig(kubeCfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := csiaddonsv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	// A fixed mapping for the one kind this client handles spares a discovery round trip at
	// every start.
	mapper := meta.NewDefaultRESTMapper([]schema.GroupVersion{csiaddonsv1alpha1.GroupVersion})
	mapper.Add(csiaddonsv1alpha1.GroupVersion.WithKind("CSIAddonsNode"), meta.RESTScopeNamespace)
	crClient, err := client.NewWithWatch(opts.KubeConfig, client.Options{Scheme: scheme, Mapper: mapper})
	if err != nil {
		return nil, fmt.Errorf("CSIAddonsNode client: %w", err)
	}
	s.volumes = newVolumes(kube, &s.opts)
	s.attachments = newNodeAttachments(kube, opts.NodeName)
	s.auth = newAuthenticator(kube.AuthenticationV1().TokenReviews(), &s.opts, s.metrics, opts.Clock)

	var creds credentials.TransportCredentials
	if !opts.Insecure {
		name := ""
		if opts.TLSServerName != "" {
			name = opts.NodeName + "." + opts.TLSServerName
		}
		kp, err := newKeyPair(opts.TLSCertFile, opts.TLSKeyFile, name)
		if err != nil {
			return nil, err
		}
		tlsCfg, err := kp.tlsConfig(opts.ClientCAFile)
		if err != nil {
			return nil, err
		}
		s.keys = kp
		creds = credentials.NewTLS(tlsCfg)
	}
	if s.driver, err = newDriverClient(&s.opts, s.metrics); err != nil {
		return nil, err
	}
	s.driver.onReconnect = func(*driverInfo) {
		select {
		case s.driverRestarted <- struct{}{}:
		default: // one pending restart covers several
		}
	}

	serverOpts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(opts.MaxMessageSize),
		grpc.MaxSendMsgSize(opts.MaxMessageSize),
		// The caller is authenticated before these run (authenticatedFirst).
		grpc.ChainUnaryInterceptor(s.observe, s.recoverPanics),
	}
	serverOpts = append(serverOpts, serverLimits().options()...)
	if creds != nil {
		serverOpts = append(serverOpts, grpc.Creds(creds))
	}
	if opts.ContainerRuntimeEndpoint != "" {
		s.runtime, err = restart.New(restart.Options{
			Endpoint:        opts.ContainerRuntimeEndpoint,
			StopGracePeriod: opts.ContainerStopGracePeriod,
			OnReachable:     s.metrics.runtimeReachable,
			Clock:           opts.Clock,
		})
		if err != nil {
			_ = s.driver.close()
			return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
		}
	}
	s.grpc = grpc.NewServer(serverOpts...)
	s.healer = &nodeHealer{
		nodeName: opts.NodeName, driver: s.driver, volumes: s.volumes, metrics: s.metrics, attachments: s.attachments,
		local: nodeprobe.New(nodeprobe.Options{
			KubeletDir: opts.KubeletDir,
			Stat:       nodeprobe.StatterOptions{Command: opts.StatCommand, Timeout: opts.StatTimeout},
		}),
		runtime:        s.runtime,
		restartTimeout: opts.ContainerStopGracePeriod + restartCallsTimeout,
		started:        opts.Clock.Now(),
		clock:          opts.Clock,
		podVolumes:     nodeprobe.NewPodVolumes(opts.KubeletDir, publishTargetsMaxAge, opts.Clock.Now),
	}
	s.grpc.RegisterService(s.authenticatedFirst(&healerv1alpha1.NodeHealer_ServiceDesc), s.healer)

	if s.lis, err = net.Listen("tcp", opts.ListenAddress); err != nil {
		_ = s.driver.close()
		return nil, fmt.Errorf("listen on %s: %w", opts.ListenAddress, err)
	}
	endpoint, err := advertiseAddress(&s.opts, s.lis.Addr())
	if err != nil {
		s.closeListeners()
		return nil, err
	}
	s.reg = &registrar{
		client:        crClient,
		watcher:       crClient,
		namespace:     opts.Namespace,
		name:          opts.CSIAddonsNodeName,
		nodeName:      opts.NodeName,
		podUID:        opts.PodUID,
		endpoint:      endpoint,
		clock:         opts.Clock,
		backoff:       opts.RegisterBackoff,
		maxBackoff:    opts.RegisterMaxBackoff,
		csiAddonsWait: opts.CSIAddonsSidecarWait,
	}
	if opts.MetricsAddress != "0" {
		if s.metricsLis, err = net.Listen("tcp", opts.MetricsAddress); err != nil {
			s.closeListeners()
			return nil, fmt.Errorf("listen on %s for metrics: %w", opts.MetricsAddress, err)
		}
		s.http = &http.Server{Handler: s.httpHandler(), ReadHeaderTimeout: 10 * time.Second}
	}
	return s, nil
}

func (s *Sidecar) closeListeners() {
	_ = s.driver.close()
	if s.runtime != nil {
		_ = s.runtime.Close()
	}
	if s.lis != nil {
		_ = s.lis.Close()
	}
	if s.metricsLis != nil {
		_ = s.metricsLis.Close()
	}
}

// Addr is the address NodeHealer is served on.
func (s *Sidecar) Addr() net.Addr { return s.lis.Addr() }

// MetricsAddr is the address of the metrics server, or nil when it is off.
func (s *Sidecar) MetricsAddr() net.Addr {
	if s.metricsLis == nil {
		return nil
	}
	return s.metricsLis.Addr()
}

// Endpoint is the "host:port" the sidecar advertises on its CSIAddonsNode.
func (s *Sidecar) Endpoint() string { return s.reg.endpoint }

// Registered is closed once the CSIAddonsNode carries this start's restart marker.
func (s *Sidecar) Registered() <-chan struct{} { return s.registered }

// Ready reports whether calls can be answered: the driver has told its name and capabilities.
func (s *Sidecar) Ready() bool {
	return s.driver.cached() != nil
}

// Start serves until ctx is done, then stops accepting calls, lets the calls in flight finish
// within Options.ShutdownTimeout, and returns. It returns nil after a stop through ctx, and an
// error when serving fails.
func (s *Sidecar) Start(ctx context.Context) error {
	log := klog.FromContext(ctx).WithValues("node", s.opts.NodeName)
	ctx = klog.NewContext(ctx, log)
	s.log = log
	if s.opts.Insecure {
		log.Error(nil, "WARNING: serving NodeHealer WITHOUT TLS (--insecure). ServiceAccount tokens cross the network "+
			"in clear text and anyone on the path can replay them. Use this for tests and demos only.", "address", s.lis.Addr().String())
	}
	log.Info("Starting the healer sidecar", "address", s.lis.Addr().String(), "endpoint", s.reg.endpoint,
		"driverEndpoint", s.driver.endpoint, "metricsAddress", addrString(s.MetricsAddr()), "containerRuntime", s.runtimeEndpoint())

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		s.driver.watch(gctx)
		return nil
	})
	g.Go(func() error {
		s.attachments.run(gctx)
		return nil
	})
	g.Go(func() error {
		if err := s.grpc.Serve(s.lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("serve NodeHealer on %s: %w", s.lis.Addr(), err)
		}
		return nil
	})
	if s.http != nil {
		g.Go(func() error {
			if err := s.http.Serve(s.metricsLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve metrics on %s: %w", s.metricsLis.Addr(), err)
			}
			return nil
		})
	}
	if s.keys != nil {
		g.Go(func() error { return s.keys.Start(gctx) })
	}
	if s.runtime != nil {
		g.Go(func() error { return s.runtime.Start(gctx) })
	}
	g.Go(func() error {
		s.runRegistration(gctx)
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		s.shutdown(gctx)
		return nil
	})
	err := g.Wait()
	if cerr := s.driver.close(); cerr != nil && err == nil {
		log.V(2).Info("Closing the driver connection", "error", cerr.Error())
	}
	if s.runtime != nil {
		if cerr := s.runtime.Close(); cerr != nil {
			log.V(2).Info("Closing the container runtime connection", "error", cerr.Error())
		}
	}
	log.Info("Healer sidecar stopped")
	return err
}

// runRegistration runs register until ctx ends. A panic in it is logged and counted, and it
// starts over after a backoff: without a registration the controller would never sweep the
// node's restarts. Starting over writes a new restart marker, which costs one sweep of the node,
// as a restart does.
func (s *Sidecar) runRegistration(ctx context.Context) {
	s.supervise(ctx, goroutineRegistration, s.register)
}

// register writes the restart marker as soon as the driver is ready to heal: it has answered
// GetIdentity and GetHealerCapabilities on its CSI-Addons socket, and, for a sidecar given the
// container runtime, the runtime has been asked once (within its check timeout), so that the
// restart sweep reads capabilities that say whether containers can be restarted in place rather
// than "not asked yet", which would evict pods it could restart. Not before, which would send
// the controller's sweep to a sidecar that answers UNAVAILABLE; not later, since the sidecar
// reads nothing ahead: each call carries its volume's facts, and the node's attached volumes are
// one watched object. It writes a new marker each time the driver restarts under the running
// sidecar (the driver container alone crashed), since that kills userspace mounters just as a
// restart of the whole pod does.
func (s *Sidecar) register(ctx context.Context) {
	log := klog.FromContext(ctx)
	select {
	case <-s.driver.loaded:
	case <-ctx.Done():
		return
	}
	if s.runtime != nil {
		select {
		case <-s.runtime.Asked():
		case <-ctx.Done():
			return
		}
	}
	info := s.driver.cached()
	log.Info("The driver is ready to heal; writing the restart marker", "driver", info.name)
	// A reconnect seen before the first registration is part of this start.
	select {
	case <-s.driverRestarted:
	default:
	}
	if _, err := s.reg.run(ctx, info.name); err != nil {
		return
	}
	s.registeredOnce.Do(func() { close(s.registered) })
	// The keeping of this registration ends with it, also when register panics and starts over.
	kctx, stopKeep := context.WithCancel(ctx)
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		s.supervise(kctx, goroutineRegistrationWatch, func(ctx context.Context) { s.reg.keep(ctx, info.name) })
	}()
	defer func() {
		stopKeep()
		<-kept
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.driverRestarted:
		}
		info := s.driver.cached()
		log.Info("The driver restarted; writing a new restart marker", "driver", info.name)
		if _, err := s.reg.run(ctx, info.name); err != nil {
			return
		}
	}
}

// shutdown stops accepting calls, takes the sidecar's endpoint off its CSIAddonsNode (within
// deregisterTimeout) and gives the calls in flight ShutdownTimeout to finish.
func (s *Sidecar) shutdown(ctx context.Context) {
	log := klog.FromContext(ctx)
	log.Info("Stopping: no new calls; waiting for calls in flight", "timeout", s.opts.ShutdownTimeout)
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	t := s.opts.Clock.NewTimer(s.opts.ShutdownTimeout)
	defer t.Stop()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deregisterTimeout)
	if err := s.reg.deregister(dctx); err != nil {
		log.Error(err, "Cannot take the sidecar's endpoint off the CSIAddonsNode; the controller finds it refused until a successor registers")
	}
	cancel()
	select {
	case <-stopped:
	case <-t.C():
		log.Info("Calls still in flight after the shutdown timeout; cutting them off", "timeout", s.opts.ShutdownTimeout)
		s.grpc.Stop()
		<-stopped
	}
	if s.http != nil {
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if err := s.http.Shutdown(hctx); err != nil {
			_ = s.http.Close()
		}
	}
}

// httpHandler serves the metrics and two probes for the pod: /healthz while the process serves,
// /readyz once calls can be answered.
func (s *Sidecar) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.opts.Registry, promhttp.HandlerOpts{Registry: s.opts.Registry}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case s.driver.cached() == nil:
			http.Error(w, "driver identity and capabilities not loaded from "+s.driver.endpoint, http.StatusServiceUnavailable)
		default:
			_, _ = w.Write([]byte("ok\n"))
		}
	})
	return mux
}

// runtimeEndpoint is the container runtime's socket, for logs, or "off".
func (s *Sidecar) runtimeEndpoint() string {
	if s.runtime == nil {
		return "off"
	}
	return s.runtime.Endpoint()
}

func addrString(a net.Addr) string {
	if a == nil {
		return "off"
	}
	return a.String()
}
