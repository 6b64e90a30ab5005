package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/volume-healer/volume-healer/config"
	"github.com/volume-healer/volume-healer/scheduler"
)

// shutdownTimeout bounds how long the controller's parts get to stop after a signal.
const shutdownTimeout = 30 * time.Second

// Run starts the controller and blocks until ctx ends or a part fails.
func Run(ctx context.Context, cfg *config.Config) error {
	logger := klog.FromContext(ctx)
	ctrl.SetLogger(logger)

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

	recorder := mgr.GetEventRecorderFor("volume-healer") //nolint:staticcheck // the record API is what the scheduler takes
	sweeps := &sweepLog{}
	restarts, err := scheduler.NewRestarts(scheduler.RestartOptions{
		Debounce: cfg.Restart.Debounce,
		Metrics:  schedMetrics,
		Sweeps:   sweeps.submit(ctx),
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
		Sweeps:         sweeps.submit(ctx),
	})
	if err != nil {
		return err
	}
	if err := watchTriggers(ctx, mgr, restarts, periodic); err != nil {
		return err
	}
	for _, r := range []manager.Runnable{restarts, periodic} {
		if err := mgr.Add(r); err != nil {
			return err
		}
	}

	logger.Info("Starting volume-healer", "leaderElection", cfg.LeaderElection.Enabled, "dryRun", cfg.DryRun)
	return mgr.Start(ctx)
}

// watchTriggers feeds CSIAddonsNode and StorageClass changes from the shared informers to the
// restart and periodic triggers.
func watchTriggers(ctx context.Context, mgr manager.Manager, restarts *scheduler.Restarts, periodic *scheduler.Periodic) error {
	nodes, err := mgr.GetCache().GetInformer(ctx, &csiaddonsv1alpha1.CSIAddonsNode{})
	if err != nil {
		return fmt.Errorf("CSIAddonsNode informer: %w", err)
	}
	if _, err := nodes.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { observeNode(ctx, restarts, obj) },
		UpdateFunc: func(_, obj any) { observeNode(ctx, restarts, obj) },
		DeleteFunc: func(obj any) {
			if n := csiAddonsNodeFrom(obj); n != nil {
				restarts.Forget(types.NamespacedName{Namespace: n.Namespace, Name: n.Name})
			}
		},
	}); err != nil {
		return err
	}
	classes, err := mgr.GetCache().GetInformer(ctx, &storagev1.StorageClass{})
	if err != nil {
		return fmt.Errorf("StorageClass informer: %w", err)
	}
	_, err = classes.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { setClass(ctx, periodic, obj) },
		UpdateFunc: func(_, obj any) { setClass(ctx, periodic, obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if sc, ok := obj.(*storagev1.StorageClass); ok {
				periodic.RemoveStorageClass(sc.Name)
			}
		},
	})
	return err
}

func observeNode(ctx context.Context, restarts *scheduler.Restarts, obj any) {
	if n := csiAddonsNodeFrom(obj); n != nil {
		restarts.Observe(ctx, n)
	}
}

func csiAddonsNodeFrom(obj any) *csiaddonsv1alpha1.CSIAddonsNode {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	n, _ := obj.(*csiaddonsv1alpha1.CSIAddonsNode)
	return n
}

func setClass(ctx context.Context, periodic *scheduler.Periodic, obj any) {
	if sc, ok := obj.(*storagev1.StorageClass); ok {
		periodic.SetStorageClass(ctx, sc)
	}
}

// sweepLog receives the sweeps the triggers request. Volume selection, policy and calls attach
// here; until then each requested sweep is logged and left pending, so that no restart is marked
// handled without its volumes having been looked at.
type sweepLog struct{}

func (s *sweepLog) submit(ctx context.Context) func(scheduler.Sweep) {
	return func(sw scheduler.Sweep) {
		klog.FromContext(ctx).Info("Sweep requested", "trigger", sw.Trigger, "driver", sw.Driver, "node", sw.Node, "storageClass", sw.StorageClass, "marker", sw.Marker)
	}
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
