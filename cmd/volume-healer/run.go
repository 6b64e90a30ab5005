package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/volume-healer/volume-healer/config"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler"
)

// shutdownTimeout bounds how long the controller's parts get to stop after a signal.
const shutdownTimeout = 30 * time.Second

// Run starts the controller and blocks until ctx ends or a part fails.
func Run(ctx context.Context, cfg *config.Config) error {
	logger := klog.FromContext(ctx)
	ctrl.SetLogger(logger)
	if limit, err := config.SetMemoryLimit("/sys/fs/cgroup", os.LookupEnv); err != nil {
		logger.Error(err, "Running without a Go memory limit")
	} else {
		logger.Info("Go memory limit", "bytes", limit.Bytes, "source", limit.Source)
	}

	restCfg, err := restConfig(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := csiaddonsv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	schedMetrics := scheduler.NewMetrics(reg)

	grace := shutdownTimeout
	mgr, err := ctrl.NewManager(restCfg, manager.Options{
		Scheme: scheme,
		Logger: logger,
		// Metrics are served from the controller's own registry (metricsServer below).
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        cfg.Health.BindAddress,
		LeaderElection:                cfg.LeaderElection.Enabled,
		LeaderElectionNamespace:       cfg.LeaderElection.Namespace,
		LeaderElectionID:              cfg.LeaderElection.LeaseName,
		LeaseDuration:                 &cfg.LeaderElection.LeaseDuration,
		RenewDeadline:                 &cfg.LeaderElection.RenewDeadline,
		RetryPeriod:                   &cfg.LeaderElection.RetryPeriod,
		LeaderElectionReleaseOnCancel: true,
		GracefulShutdownTimeout:       &grace,
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("informers", func(req *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(req.Context()) {
			return errors.New("informer caches not synced")
		}
		return nil
	}); err != nil {
		return err
	}
	if cfg.Metrics.BindAddress != "0" {
		if err := mgr.Add(&metricsServer{addr: cfg.Metrics.BindAddress, registry: reg}); err != nil {
			return err
		}
	}

	clientset, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	// The policy source, the sweeper and the periodic trigger record core/v1 Events through a
	// record.EventRecorder. The manager's GetEventRecorderFor is deprecated, so the controller runs
	// the broadcaster behind it itself, and stops it after the manager, as the manager did.
	broadcaster := record.NewBroadcaster(record.WithContext(context.WithoutCancel(ctx)))
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: clientset.CoreV1().Events("")})
	broadcaster.StartStructuredLogging(1)
	recorder := broadcaster.NewRecorder(scheme, corev1.EventSource{Component: "volume-healer"})

	// Policy: the built-in default until the ConfigMaps are read, then whatever they say.
	policyMetrics, err := policy.NewMetrics(reg)
	if err != nil {
		return err
	}
	engine, err := policy.NewEngine(ctx, policy.Options{
		Compile: policy.CompileOptions{EvalTimeout: cfg.Policy.EvaluationTimeout},
		Metrics: policyMetrics,
	})
	if err != nil {
		return err
	}
	policySource, err := policy.NewConfigMapSource(clientset, engine, policy.ConfigMapOptions{
		Namespace: cfg.Policy.Namespace, LabelSelector: cfg.Policy.LabelSelector, Recorder: recorder,
	})
	if err != nil {
		return err
	}

	// Storage objects: shared informers with the planner's indexes, holding compact records of
	// PVs, PVCs and VolumeAttachments (see scheduler.CacheTransform).
	factory := informers.NewSharedInformerFactoryWithOptions(clientset, 0, informers.WithTransform(scheduler.CacheTransform))
	caches, err := scheduler.InformerCaches(factory)
	if err != nil {
		return err
	}

	sidecars, err := sidecarClient(cfg)
	if err != nil {
		return err
	}
	dispatcher, err := scheduler.NewDispatcher(scheduler.DispatcherOptions{
		Global:      cfg.Budgets.Global,
		PerDriver:   cfg.Budgets.PerDriver,
		PerNode:     cfg.Budgets.PerNode,
		BackoffBase: cfg.Backoff.Base,
		BackoffMax:  cfg.Backoff.Max,
		// A task is a probe, a heal and a confirming probe.
		DefaultTimeout: 2*cfg.Timeouts.Probe + cfg.Timeouts.Heal,
		Metrics:        scheduler.NewDispatchMetrics(reg),
	})
	if err != nil {
		return err
	}
	targets := healer.NewTargetMap()
	healerMetrics := healer.NewMetrics(reg)
	if err := mgr.Add(everyReplica{manager.RunnableFunc(func(ctx context.Context) error {
		healerMetrics.SetLeader(false)
		select {
		case <-mgr.Elected():
			healerMetrics.SetLeader(true)
		case <-ctx.Done():
		}
		return nil
	})}); err != nil {
		return err
	}
	sweeper, err := healer.New(healer.Options{
		Planner:    scheduler.NewPlanner(caches),
		Policy:     engine,
		Sidecars:   sidecars,
		Dispatcher: dispatcher,
		Targets:    targets,
		Client:     mgr.GetClient(),
		Recorder:   recorder,
		Metrics:    healerMetrics,
		DryRun:     cfg.DryRun,
	})
	if err != nil {
		return err
	}
	reg.MustRegister(sweeper)
	sweeps := &sweepRunner{sweeper: sweeper, ready: func(ctx context.Context) error {
		// A sweep planned from caches still filling would find no volumes and, for a restart,
		// record the marker as handled: the restart would be lost. The policy ConfigMaps must be
		// read too, or the first sweeps would run on the built-in policy.
		return wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
			return storageSynced(factory) == nil && policySource.HasSynced(), nil
		})
	}}

	restarts, err := scheduler.NewRestarts(scheduler.RestartOptions{
		Debounce: cfg.Restart.Debounce,
		Metrics:  schedMetrics,
		Sweeps:   sweeps.submit,
	})
	if err != nil {
		return err
	}
	periodic, err := scheduler.NewPeriodic(scheduler.PeriodicOptions{
		Default:        cfg.Schedule.Default,
		StorageClasses: cfg.Schedule.StorageClasses,
		Stagger:        cfg.Schedule.Stagger,
		Recorder:       recorder,
		Metrics:        schedMetrics,
		Sweeps:         sweeps.submit,
	})
	if err != nil {
		return err
	}
	manual, err := scheduler.NewManual(scheduler.ManualOptions{Metrics: schedMetrics, Sweeps: sweeps.submit})
	if err != nil {
		return err
	}
	if err := watchTriggers(ctx, mgr, factory, targets, sweeper, sidecars, triggers{restarts, periodic, manual}); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("storage-informers", func(*http.Request) error {
		return storageSynced(factory)
	}); err != nil {
		return err
	}
	// The informers and the policy source run on every replica, so a new leader starts warm; the
	// dispatcher, the triggers and the sweeps run on the leader only.
	for _, r := range []manager.Runnable{
		manager.RunnableFunc(func(ctx context.Context) error {
			factory.Start(ctx.Done())
			// Filling the caches decodes every object once and keeps a compact record of it: the
			// decoded objects are garbage the heap holds until its next collection, and their pages
			// stay with the process until the runtime's scavenger slowly returns them. One
			// collection once the caches are full returns them at once, so that a replica's
			// footprint starts at what it keeps rather than at what filling took.
			factory.WaitForCacheSync(ctx.Done())
			if storageSynced(factory) == nil {
				debug.FreeOSMemory()
			}
			<-ctx.Done()
			factory.Shutdown()
			return nil
		}),
		manager.RunnableFunc(policySource.Start),
	} {
		if err := mgr.Add(everyReplica{r}); err != nil {
			return err
		}
	}
	for _, r := range []manager.Runnable{dispatcher, sweeps, restarts, periodic} {
		if err := mgr.Add(r); err != nil {
			return err
		}
	}

	logger.Info("Starting volume-healer", "leaderElection", cfg.LeaderElection.Enabled, "dryRun", cfg.DryRun)
	return mgr.Start(ctx)
}

// watchTriggers feeds CSIAddonsNode and StorageClass changes from the shared informers to the
// sidecar targets and to the restart and periodic triggers.
func watchTriggers(ctx context.Context, mgr manager.Manager, factory informers.SharedInformerFactory, targets *healer.TargetMap,
	sweeper *healer.Sweeper, sidecars *probe.Client, t triggers) error {
	observeNode := func(obj any) {
		n := csiAddonsNodeFrom(obj)
		if n == nil {
			return
		}
		// A sidecar that moved gets a new connection; the old one is closed.
		if stale := targets.Set(n); stale != "" {
			sidecars.Forget(stale)
		}
		t.restarts.Observe(ctx, n)
		t.manual.Observe(ctx, n)
	}
	nodes, err := mgr.GetCache().GetInformer(ctx, &csiaddonsv1alpha1.CSIAddonsNode{})
	if err != nil {
		return fmt.Errorf("CSIAddonsNode informer: %w", err)
	}
	if _, err := nodes.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    observeNode,
		UpdateFunc: func(_, obj any) { observeNode(obj) },
		DeleteFunc: func(obj any) {
			if n := csiAddonsNodeFrom(obj); n != nil {
				key := types.NamespacedName{Namespace: n.Namespace, Name: n.Name}
				if endpoint := targets.Delete(key); endpoint != "" {
					sidecars.Forget(endpoint)
				}
				t.restarts.Forget(key)
			}
		},
	}); err != nil {
		return err
	}
	_, err = factory.Storage().V1().StorageClasses().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { setClass(ctx, t, obj) },
		UpdateFunc: func(_, obj any) { setClass(ctx, t, obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if sc, ok := obj.(*storagev1.StorageClass); ok {
				t.periodic.RemoveStorageClass(sc.Name)
				sweeper.ForgetStorageClass(sc.Name)
			}
		},
	})
	if err != nil {
		return err
	}
	// A deleted PV's history goes with it.
	_, err = factory.Core().V1().PersistentVolumes().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if pv := scheduler.PersistentVolumeFrom(obj); pv != nil {
				sweeper.Forget(pv)
			}
		},
	})
	if err != nil {
		return err
	}
	// PVCs carry manual sweep requests for their volume.
	observeClaim := func(obj any) {
		if pvc := scheduler.ClaimFrom(obj); pvc != nil {
			t.manual.Observe(ctx, pvc)
		}
	}
	_, err = factory.Core().V1().PersistentVolumeClaims().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    observeClaim,
		UpdateFunc: func(_, obj any) { observeClaim(obj) },
	})
	return err
}

// triggers are what turns object changes into sweeps.
type triggers struct {
	restarts *scheduler.Restarts
	periodic *scheduler.Periodic
	manual   *scheduler.Manual
}

func csiAddonsNodeFrom(obj any) *csiaddonsv1alpha1.CSIAddonsNode {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	n, _ := obj.(*csiaddonsv1alpha1.CSIAddonsNode)
	return n
}

func setClass(ctx context.Context, t triggers, obj any) {
	if sc, ok := obj.(*storagev1.StorageClass); ok {
		t.periodic.SetStorageClass(ctx, sc)
		t.manual.Observe(ctx, sc)
	}
}

// sweepRunner runs each requested sweep in its own goroutine, on the leader, and waits for them
// when leadership or the process ends. Overlapping sweeps are safe: the dispatcher never runs two
// calls on one volume.
type sweepRunner struct {
	sweeper *healer.Sweeper
	// ready blocks until sweeps can be planned correctly.
	ready   func(context.Context) error
	mu      sync.Mutex
	ctx     context.Context
	pending []scheduler.Sweep
	wg      sync.WaitGroup
}

// submit starts sw, or keeps it until Start is ready when the runner has not started yet.
func (r *sweepRunner) submit(sw scheduler.Sweep) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx == nil {
		r.pending = append(r.pending, sw)
		return
	}
	if r.ctx.Err() != nil {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.sweeper.Run(r.ctx, sw)
	}()
}

// Start runs sweeps until ctx ends, then waits for the running ones to stop.
func (r *sweepRunner) Start(ctx context.Context) error {
	if err := r.ready(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	klog.FromContext(ctx).Info("Caches synced and policy loaded: sweeps start")
	r.mu.Lock()
	r.ctx = ctx
	pending := r.pending
	r.pending = nil
	r.mu.Unlock()
	for _, sw := range pending {
		r.submit(sw)
	}
	<-ctx.Done()
	r.wg.Wait()
	return nil
}

// storageSynced reports whether the storage informers have started and filled their caches.
func storageSynced(factory informers.SharedInformerFactory) error {
	// A closed channel makes the wait a look: synced now or not.
	now := make(chan struct{})
	close(now)
	synced := factory.WaitForCacheSync(now)
	if len(synced) == 0 {
		return errors.New("storage informers not started")
	}
	for typ, ok := range synced {
		if !ok {
			return fmt.Errorf("%v informer not synced", typ)
		}
	}
	return nil
}

// everyReplica marks a runnable that runs whether or not this replica leads.
type everyReplica struct{ manager.Runnable }

// NeedLeaderElection reports that the runnable runs on standby replicas too.
func (everyReplica) NeedLeaderElection() bool { return false }

// sidecarClient builds the client of the sidecars from the configuration.
func sidecarClient(cfg *config.Config) (*probe.Client, error) {
	opts := probe.Options{
		TokenFile:    cfg.Sidecar.Auth.TokenFile,
		ProbeTimeout: cfg.Timeouts.Probe,
		HealTimeout:  cfg.Timeouts.Heal,
	}
	if cfg.Sidecar.TLS.Enabled {
		tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.Sidecar.TLS.ServerName, InsecureSkipVerify: cfg.Sidecar.TLS.InsecureSkipVerify} // insecureSkipVerify is an explicit, validated setting
		if cfg.Sidecar.TLS.CAFile != "" {
			pem, err := os.ReadFile(cfg.Sidecar.TLS.CAFile)
			if err != nil {
				return nil, fmt.Errorf("sidecar.tls.caFile: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("sidecar.tls.caFile %s: no PEM certificate in it", cfg.Sidecar.TLS.CAFile)
			}
			tlsCfg.RootCAs = pool
		}
		if cfg.Sidecar.TLS.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(cfg.Sidecar.TLS.CertFile, cfg.Sidecar.TLS.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("sidecar.tls.certFile and keyFile: %w", err)
			}
			tlsCfg.Certificates = []tls.Certificate{cert}
		}
		opts.TLS = tlsCfg
	}
	return probe.New(opts), nil
}

// restConfig loads the kubeconfig at path, or $KUBECONFIG, or the in-cluster configuration.
func restConfig(path string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %q: %w", path, err)
	}
	cfg.UserAgent = "volume-healer"
	// Sweeps write an Event and a PVC annotation per healed volume; client-go's default of 5
	// requests per second would make those writes, not the budgets, bound a rollout's heal rate.
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

// metricsServer serves the controller's registry on /metrics. It runs on every replica, leader or
// not, so that a standby is visible too.
type metricsServer struct {
	addr     string
	registry *prometheus.Registry
}

// NeedLeaderElection reports that the metrics endpoint runs on standby replicas too.
func (m *metricsServer) NeedLeaderElection() bool { return false }

// Start serves until ctx ends, then shuts down within shutdownTimeout.
func (m *metricsServer) Start(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry}))
	ln, err := net.Listen("tcp", m.addr)
	if err != nil {
		return fmt.Errorf("metrics listener on %s: %w", m.addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics server: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	return srv.Shutdown(shutdownCtx)
}
