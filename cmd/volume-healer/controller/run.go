package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/volume-healer/volume-healer/cmd/volume-healer/controller/leader"
	"github.com/volume-healer/volume-healer/config"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/policy/webhook"
	"github.com/volume-healer/volume-healer/scheduler/dispatch"
	"github.com/volume-healer/volume-healer/scheduler/planner"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
	"github.com/volume-healer/volume-healer/version"
	"github.com/volume-healer/volume-healer/version/versionmetrics"
)

// shutdownTimeout bounds how long the controller's parts get to stop after a signal.
const shutdownTimeout = 30 * time.Second

// Run starts the controller and blocks until ctx ends or a part fails.
func Run(ctx context.Context, cfg *config.Config) error {
	logger := klog.FromContext(ctx)
	ctrl.SetLogger(logger)
	// Once the caches are full, budget holds the Go memory limit a headroom above them while no
	// sweep runs (heap.go), under the container's; a GOMEMLIMIT set by the operator is left alone.
	var budget *heapBudget
	if limit, err := config.SetMemoryLimit("/sys/fs/cgroup", os.LookupEnv); err != nil {
		logger.Error(err, "Running without a Go memory limit")
	} else {
		logger.Info("Go memory limit", "bytes", limit.Bytes, "source", limit.Source)
		if limit.Source != config.MemoryLimitFromEnv {
			budget = &heapBudget{ceiling: limit.Bytes}
		}
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
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		versionmetrics.NewBuildInfo(version.Get()))
	schedMetrics := trigger.NewMetrics(reg)

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

	grace := shutdownTimeout
	mgrOpts := manager.Options{
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
	}
	// With leader election, every call to a sidecar ends before another replica could take the
	// Lease over, and the Lease is released only after the calls in flight returned
	// (docs/operations.md, "Leader election and calls in flight").
	var lease *leader.Lease
	if cfg.LeaderElection.Enabled {
		if lease, err = newLease(restCfg, cfg.LeaderElection, broadcaster, scheme); err != nil {
			return err
		}
		mgrOpts.LeaderElectionResourceLockInterface = lease
	}
	mgr, err := ctrl.NewManager(restCfg, mgrOpts)
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if cfg.Metrics.BindAddress != "0" {
		if err := mgr.Add(&metricsServer{addr: cfg.Metrics.BindAddress, registry: reg}); err != nil {
			return err
		}
	}

	// The controller reads the API through the one shared informer factory below; this client
	// only writes (patches, and the CSIAddonsNode informer's list and watch), it has no cache.
	apiClient, err := client.NewWithWatch(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}

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
	// Every replica loads the policy; the leader alone reports rejections.
	var leading atomic.Bool
	policySource, err := policy.NewConfigMapSource(clientset, engine, policy.ConfigMapOptions{
		Namespace: cfg.Policy.Namespace, LabelSelector: cfg.Policy.LabelSelector, Recorder: recorder, Leading: leading.Load,
	})
	if err != nil {
		return err
	}

	// The admission webhook judges policy changes with the source's ConfigMaps, on every replica.
	if cfg.Webhook.Enabled {
		webhookMetrics, err := webhook.NewMetrics(reg)
		if err != nil {
			return err
		}
		server, err := webhook.NewServer(webhook.Options{
			Addr:     cfg.Webhook.BindAddress,
			CertFile: cfg.Webhook.CertFile,
			KeyFile:  cfg.Webhook.KeyFile,
			Checker:  policySource,
			Metrics:  webhookMetrics,
		})
		if err != nil {
			return fmt.Errorf("webhook.certFile and webhook.keyFile: %w", err)
		}
		if err := mgr.Add(server); err != nil {
			return err
		}
		if err := mgr.AddReadyzCheck("webhook", server.Ready); err != nil {
			return err
		}
	}

	// Every object the controller reads comes from one shared informer factory: the storage
	// objects with the planner's indexes, held as compact records of PVs, PVCs and
	// VolumeAttachments (see planner.CacheTransform); the CSIAddonsNodes; the policy ConfigMaps.
	factory := informers.NewSharedInformerFactoryWithOptions(clientset, 0, informers.WithTransform(planner.CacheTransform))
	caches, err := planner.InformerCaches(factory)
	if err != nil {
		return err
	}
	nodes := factory.InformerFor(&csiaddonsv1alpha1.CSIAddonsNode{}, csiAddonsNodeInformer(apiClient))
	if err := policySource.Watch(factory); err != nil {
		return err
	}

	dispatchOpts := dispatch.Options{
		Global:      cfg.Budgets.Global,
		PerDriver:   cfg.Budgets.PerDriver,
		PerNode:     cfg.Budgets.PerNode,
		BackoffBase: cfg.Backoff.Base,
		BackoffMax:  cfg.Backoff.Max,
		// A task is a probe, a heal and a confirming probe.
		DefaultTimeout: 2*cfg.Timeouts.Probe + cfg.Timeouts.Heal,
		Metrics:        dispatch.NewMetrics(reg),
	}
	var guard func(context.Context) (context.Context, func(), error)
	if lease != nil {
		dispatchOpts.Lease = lease
		guard = lease.Guard
	}
	sidecars, err := sidecarClient(cfg, clientset.CoreV1(), guard)
	if err != nil {
		return err
	}
	dispatcher, err := dispatch.New(dispatchOpts)
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
			leading.Store(true)
			policySource.Resync()
		case <-ctx.Done():
		}
		return nil
	})}); err != nil {
		return err
	}
	// The eviction metrics are exposed with remediation off too, at zero, so that the dashboard
	// and the alerts read the same series whatever the setting.
	evictMetrics := evict.NewMetrics(reg)
	var evictor *evict.Evictor
	if cfg.Remediation.Enabled {
		evictor, err = evict.New(evict.Options{
			Client:                clientset,
			Policy:                engine,
			Recorder:              recorder,
			Metrics:               evictMetrics,
			DryRun:                cfg.Remediation.DryRun || cfg.DryRun,
			PerMinute:             cfg.Remediation.EvictionsPerMinute,
			PerNamespacePerMinute: cfg.Remediation.EvictionsPerNamespacePerMinute,
			// A blocked eviction is tried again on the same backoff as a failing volume.
			BackoffBase: cfg.Backoff.Base,
			BackoffMax:  cfg.Backoff.Max,
		})
		if err != nil {
			return err
		}
	}
	sweeper, err := healer.New(healer.Options{
		Planner:    planner.NewPlanner(caches),
		Policy:     engine,
		Sidecars:   sidecars,
		Dispatcher: dispatcher,
		Targets:    targets,
		Client:     apiClient,
		Recorder:   recorder,
		Metrics:    healerMetrics,
		DryRun:     cfg.DryRun,
		// An incomplete restart sweep is tried again on the same backoff as a failing volume.
		RetryBase: cfg.Backoff.Base,
		RetryMax:  cfg.Backoff.Max,
		Restarter: restarter(evictor),
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
			return informersSynced(factory) == nil && policySource.HasSynced(), nil
		})
	}}
	if budget != nil {
		// The budget steps aside while sweeps run (heap.go).
		budget.quiet, sweeps.started = sweeps.quietSince, budget.sweepStarted
	}

	restarts, err := trigger.NewRestarts(trigger.RestartOptions{
		Debounce: cfg.Restart.Debounce,

		SweepCSIAddonsSidecarRestarts: cfg.Restart.SweepCSIAddonsSidecarRestarts,
		Metrics:                       schedMetrics,
		Sweeps:                        sweeps.submit,
	})
	if err != nil {
		return err
	}
	periodic, err := trigger.NewPeriodic(trigger.PeriodicOptions{
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
	manual, err := trigger.NewManual(trigger.ManualOptions{Metrics: schedMetrics, Sweeps: sweeps.submit})
	if err != nil {
		return err
	}
	handlers, err := watchTriggers(ctx, factory, nodes, targets, sweeper, sidecars, triggers{restarts, periodic, manual})
	if err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("informers", func(*http.Request) error {
		return informersSynced(factory)
	}); err != nil {
		return err
	}
	// The informers and the policy source run on every replica, so a new leader starts warm; the
	// dispatcher, the triggers and the sweeps run on the leader only.
	for _, r := range []manager.Runnable{
		manager.RunnableFunc(func(ctx context.Context) error {
			factory.Start(ctx.Done())
			// Filling the caches decodes every object once and keeps a compact record of it, and
			// the handlers then see every record once: the decoded objects and what the handlers
			// built are garbage the heap holds until its next collection, and their pages stay
			// with the process until the runtime's scavenger slowly returns them. One collection
			// once the caches are full and the handlers have seen them returns them at once, so
			// that a replica's footprint starts at what it keeps rather than at what filling took;
			// from there the budget keeps it near that.
			factory.WaitForCacheSync(ctx.Done())
			synced := make([]toolscache.InformerSynced, len(handlers))
			for i, h := range handlers {
				synced[i] = h.HasSynced
			}
			if informersSynced(factory) == nil && toolscache.WaitForCacheSync(ctx.Done(), synced...) {
				debug.FreeOSMemory()
				if budget != nil {
					budget.run(ctx)
				}
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
	if evictor != nil {
		if err := mgr.Add(evictor); err != nil {
			return err
		}
	}

	logger.Info("Starting volume-healer", "leaderElection", cfg.LeaderElection.Enabled, "dryRun", cfg.DryRun, "webhook", cfg.Webhook.Enabled,
		"remediation", cfg.Remediation.Enabled, "remediationDryRun", cfg.Remediation.DryRun)
	err = mgr.Start(ctx)
	if lease != nil {
		// Leadership is over, whether the process stops or the Lease was lost. When it was lost,
		// the manager returns without waiting for the leader's parts: their calls to sidecars are
		// cancelled here, and the process exits only once they have returned.
		endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		if endErr := lease.End(endCtx); endErr != nil {
			logger.Error(endErr, "Exiting while calls to sidecars are in flight")
		}
		cancel()
	}
	return err
}

// informersSynced reports whether the shared informers have started and filled their caches.
func informersSynced(factory informers.SharedInformerFactory) error {
	// A closed channel makes the wait a look: synced now or not.
	now := make(chan struct{})
	close(now)
	synced := factory.WaitForCacheSync(now)
	if len(synced) == 0 {
		return errors.New("informers not started")
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

// restarter is the sweeper's Restarter: the evictor, or none when remediation is off (a nil
// *evict.Evictor in the interface would not be nil).
func restarter(e *evict.Evictor) healer.Restarter {
	if e == nil {
		return nil
	}
	return e
}
