package controller

import (
	"context"
	"crypto/x509"
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
	"k8s.io/client-go/discovery"
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
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/volume-healer/volume-healer/admission/propagation"
	"github.com/volume-healer/volume-healer/cmd/volume-healer/controller/leader"
	"github.com/volume-healer/volume-healer/config"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/policy/webhook"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/scheduler/dispatch"
	"github.com/volume-healer/volume-healer/scheduler/planner"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
	"github.com/volume-healer/volume-healer/version"
	"github.com/volume-healer/volume-healer/version/versionmetrics"
)

// shutdownTimeout bounds how long the controller's parts get to stop after a signal.
const shutdownTimeout = 30 * time.Second

// Run starts the controller and blocks until ctx ends or a part fails. It reads as the pipeline:
// the clients and the manager, the policy that decides, the caches the planner reads, the act
// stage (dispatcher, sidecars, sweeper) and the triggers that feed it, then the run itself.
func Run(ctx context.Context, cfg *config.Config) error {
	logger := klog.FromContext(ctx)
	ctrl.SetLogger(logger)
	budget := setMemoryLimit(logger)
	for _, w := range cfg.Warnings() {
		logger.Error(nil, "WARNING: "+w.String(), "key", w.Key)
	}

	k, err := newKube(ctx, cfg)
	if err != nil {
		return err
	}
	defer k.broadcaster.Shutdown()
	if d, err := discovery.NewDiscoveryClientForConfig(k.restCfg); err != nil {
		logger.Error(err, "WARNING: cannot ask the API server for its version and APIs")
	} else {
		for _, w := range clusterWarnings(d) {
			logger.Error(nil, "WARNING: "+w)
		}
	}
	mgr, lease, err := newManager(ctx, cfg, k)
	if err != nil {
		return err
	}
	pol, err := newPolicy(ctx, cfg, k, mgr)
	if err != nil {
		return err
	}
	caches, err := newCaches(cfg, k, pol.source)
	if err != nil {
		return err
	}
	if cfg.Webhook.Enabled {
		if err := addWebhooks(cfg, k, mgr, pol, caches); err != nil {
			return err
		}
	}
	signer, signerCAs, err := newSidecarSigner(ctx, cfg, k)
	if err != nil {
		return err
	}
	var signerRoots func() *x509.CertPool
	if signerCAs != nil {
		signerRoots = signerCAs.Pool
		// Every replica follows a renewal of the CA: each one's client trusts the sidecars by it.
		if err := mgr.Add(everyReplica{manager.RunnableFunc(signerCAs.Start)}); err != nil {
			return err
		}
	}
	act, err := newActStage(cfg, k, lease, pol.engine, caches.planner, signerRoots)
	if err != nil {
		return err
	}
	if signer != nil {
		// One replica signs: the leader.
		if err := mgr.Add(signer); err != nil {
			return err
		}
	}
	if err := mgr.Add(everyReplica{leadership(mgr, act.metrics, pol)}); err != nil {
		return err
	}
	sweeps := newSweepRunner(act.sweeper, caches.factory, pol.source)
	act.submit = sweeps.submit
	if budget != nil {
		// The budget steps aside while sweeps run (heap.go).
		budget.quiet, sweeps.started = sweeps.quietSince, budget.sweepStarted
	}
	trig, err := newTriggers(cfg, k, sweeps.submit)
	if err != nil {
		return err
	}
	// A restart sweep that ended without recording its marker lets the next change of its
	// CSIAddonsNode start another; a manual sweep that ended lets its object's waiting request
	// start.
	sweeps.ended = func(sw scheduler.Sweep, recorded bool) {
		trig.restarts.Ended(sw, recorded)
		trig.manual.Ended(sw, recorded)
	}
	handlers, err := watchTriggers(ctx, caches.factory, caches.nodes, act.targets, act.sweeper, act.sidecars, trig)
	if err != nil {
		return err
	}
	if err := addRunnables(mgr, caches.factory, handlers, budget, pol.source, act, sweeps, trig); err != nil {
		return err
	}
	return start(ctx, cfg, mgr, lease)
}

// setMemoryLimit sets the Go memory limit from the container's cgroup, and logs it. It returns
// the budget that, once the caches are full, holds the limit a headroom above them while no sweep
// runs (heap.go), under the container's; nil when the operator set GOMEMLIMIT, which is left
// alone.
func setMemoryLimit(logger klog.Logger) *heapBudget {
	limit, err := config.SetMemoryLimit("/sys/fs/cgroup", os.LookupEnv)
	if err != nil {
		logger.Error(err, "Running without a Go memory limit")
		return nil
	}
	logger.Info("Go memory limit", "bytes", limit.Bytes, "source", limit.Source)
	if limit.Source == config.MemoryLimitFromEnv {
		return nil
	}
	return &heapBudget{ceiling: limit.Bytes}
}

// kube is what every step talks to the API and reports through: the clients, the scheme, the
// controller's own metrics registry and the Event recorder.
type kube struct {
	restCfg   *rest.Config
	scheme    *runtime.Scheme
	reg       *prometheus.Registry
	clientset kubernetes.Interface
	// apiClient only writes (patches, and the CSIAddonsNode informer's list and watch); the
	// controller reads the API through the one shared informer factory of newCaches.
	apiClient   client.WithWatch
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
}

// newKube builds the clients, the scheme, the metrics registry and the Event broadcaster; the
// caller shuts the broadcaster down after the manager stopped.
func newKube(ctx context.Context, cfg *config.Config) (*kube, error) {
	restCfg, err := restConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := csiaddonsv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		versionmetrics.NewBuildInfo(version.Get()))
	// The typed clientset handles built-in kinds only (the informers of PVs, PVCs,
	// VolumeAttachments and Nodes, Events, ConfigMaps, evictions), all of which the API server
	// encodes in protobuf, cheaper than JSON to decode: filling the caches at start decodes every
	// volume's objects. The CSIAddonsNode custom resource goes through apiClient, in JSON.
	typedCfg := rest.CopyConfig(restCfg)
	typedCfg.ContentType = runtime.ContentTypeProtobuf
	typedCfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	clientset, err := kubernetes.NewForConfig(typedCfg)
	if err != nil {
		return nil, err
	}
	apiClient, err := client.NewWithWatch(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	// The policy source, the sweeper and the periodic trigger record core/v1 Events through a
	// record.EventRecorder. The manager's GetEventRecorderFor is deprecated, so the controller runs
	// the broadcaster behind it itself, and stops it after the manager, as the manager did.
	broadcaster := record.NewBroadcaster(record.WithContext(context.WithoutCancel(ctx)))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: clientset.CoreV1().Events("")})
	broadcaster.StartStructuredLogging(1)
	return &kube{
		restCfg:     restCfg,
		scheme:      scheme,
		reg:         reg,
		clientset:   clientset,
		apiClient:   boundWrites(apiClient, apiWriteTimeout),
		broadcaster: broadcaster,
		recorder:    broadcaster.NewRecorder(scheme, corev1.EventSource{Component: "volume-healer"}),
	}, nil
}

// newManager builds the manager that runs every part: leader election on the Lease (nil when
// leader election is off), the health and readiness server, and the /metrics server.
func newManager(ctx context.Context, cfg *config.Config, k *kube) (manager.Manager, *leader.Lease, error) {
	grace := shutdownTimeout
	mgrOpts := manager.Options{
		Scheme: k.scheme,
		Logger: klog.FromContext(ctx),
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
		var err error
		if lease, err = newLease(k.restCfg, cfg.LeaderElection, k.broadcaster, k.scheme); err != nil {
			return nil, nil, err
		}
		mgrOpts.LeaderElectionResourceLockInterface = lease
	}
	mgr, err := ctrl.NewManager(k.restCfg, mgrOpts)
	if err != nil {
		return nil, nil, fmt.Errorf("create manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, nil, err
	}
	if cfg.Metrics.BindAddress != "0" {
		if err := mgr.Add(&metricsServer{addr: cfg.Metrics.BindAddress, registry: k.reg}); err != nil {
			return nil, nil, err
		}
	}
	return mgr, lease, nil
}

// policyStage is the decide stage: the engine, the ConfigMaps that feed it, and whether this
// replica leads (the leader alone reports rejected policies).
type policyStage struct {
	engine  *policy.Engine
	source  *policy.ConfigMapSource
	leading *atomic.Bool
}

// newPolicy builds the policy engine, on the built-in default until the ConfigMaps are read and
// then on whatever they say, and its ConfigMap source.
func newPolicy(ctx context.Context, cfg *config.Config, k *kube, mgr manager.Manager) (*policyStage, error) {
	policyMetrics := policy.NewMetrics(k.reg)
	engine, err := policy.NewEngine(ctx, policy.Options{
		Compile: policy.CompileOptions{EvalTimeout: cfg.Policy.EvaluationTimeout},
		Metrics: policyMetrics,
	})
	if err != nil {
		return nil, err
	}
	// Every replica loads the policy; the leader alone reports rejections.
	leading := new(atomic.Bool)
	source, err := policy.NewConfigMapSource(k.clientset, engine, policy.ConfigMapOptions{
		Namespace: cfg.Policy.Namespace, LabelSelector: cfg.Policy.LabelSelector, Recorder: k.recorder, Leading: leading.Load,
	})
	if err != nil {
		return nil, err
	}
	return &policyStage{engine: engine, source: source, leading: leading}, nil
}

// addWebhooks adds the admission webhooks on every replica, with their readiness check: the
// policy webhook, which judges policy changes with the source's ConfigMaps, and, when it is
// enabled, the propagation webhook, which asks the engine about pods being created and reads the
// caches.
func addWebhooks(cfg *config.Config, k *kube, mgr manager.Manager, pol *policyStage, c *caches) error {
	opts := webhook.Options{
		Addr:     cfg.Webhook.BindAddress,
		CertFile: cfg.Webhook.CertFile,
		KeyFile:  cfg.Webhook.KeyFile,
		Checker:  pol.source,
		Metrics:  webhook.NewMetrics(k.reg),
	}
	if cfg.PropagationWebhook.Enabled {
		h, err := propagation.NewHandler(propagation.Options{
			Policy: pol.engine,
			Objects: &propagation.Caches{
				Namespaces: c.namespaces.GetStore(), Claims: c.planner.PVCs, Volumes: c.planner.PVs,
				StorageClasses: c.planner.StorageClasses, CSIDrivers: c.planner.CSIDrivers,
				ClaimFrom: planner.ClaimFrom, VolumeFrom: planner.PersistentVolumeFrom,
				// A claim created a moment before its pod may not be in the cache yet.
				Client: k.clientset,
			},
			Recorder: k.recorder,
			Metrics:  propagation.NewMetrics(k.reg),
		})
		if err != nil {
			return err
		}
		opts.Handlers = map[string]http.Handler{propagation.Path: h}
	}
	server, err := webhook.NewServer(opts)
	if err != nil {
		return fmt.Errorf("webhook.certFile and webhook.keyFile: %w", err)
	}
	if err := mgr.Add(server); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("webhook", server.Ready)
}

// caches is what the controller reads the API through: one shared informer factory, the planner's
// indexed caches in it, the CSIAddonsNode informer, and the Namespace informer of the propagation
// webhook (nil when it is off).
type caches struct {
	factory    informers.SharedInformerFactory
	planner    planner.Caches
	nodes      toolscache.SharedIndexInformer
	namespaces toolscache.SharedIndexInformer
}

// newCaches builds the one shared informer factory every object the controller reads comes from:
// the storage objects with the planner's indexes, held as compact records of PVs, PVCs and
// VolumeAttachments (see planner.CacheTransform); the CSIAddonsNodes; the policy ConfigMaps; the
// Namespaces, whose labels the propagation webhook's policy reads, when it is on.
func newCaches(cfg *config.Config, k *kube, source *policy.ConfigMapSource) (*caches, error) {
	factory := informers.NewSharedInformerFactoryWithOptions(k.clientset, 0, informers.WithTransform(planner.CacheTransform))
	plannerCaches, err := planner.InformerCaches(factory)
	if err != nil {
		return nil, err
	}
	nodes := factory.InformerFor(&csiaddonsv1alpha1.CSIAddonsNode{}, csiAddonsNodeInformer(k.apiClient))
	if err := source.Watch(factory); err != nil {
		return nil, err
	}
	c := &caches{factory: factory, planner: plannerCaches, nodes: nodes}
	if cfg.Webhook.Enabled && cfg.PropagationWebhook.Enabled {
		c.namespaces = factory.Core().V1().Namespaces().Informer()
	}
	return c, nil
}

// actStage is the dispatch and act stages: the dispatcher and its budgets, the client of the
// sidecars and the targets it calls, the sweeper that plans, submits and finishes each sweep, and
// the evictor when remediation is on.
type actStage struct {
	dispatcher *dispatch.Dispatcher
	sidecars   *probe.Client
	// clientCert is the sidecars' client's certificate, read again when it changes; nil without.
	clientCert *certwatcher.CertWatcher
	targets    *healer.TargetMap
	metrics    *healer.Metrics
	evictor    *evict.Evictor
	sweeper    *healer.Sweeper
	// submit hands a sweep to the sweep runner, which is made after this stage; the evictor asks
	// for re-probes through it.
	submit func(scheduler.Sweep)
}

// newActStage builds the dispatcher, the client of the sidecars, the evictor and the sweeper that
// drives them. With leader election, both the dispatcher and the sidecar calls are bounded by the
// Lease.
func newActStage(cfg *config.Config, k *kube, lease *leader.Lease, engine *policy.Engine, plannerCaches planner.Caches, signerRoots func() *x509.CertPool) (*actStage, error) {
	dispatchOpts := dispatch.Options{
		Global:      cfg.Budgets.Global,
		PerDriver:   cfg.Budgets.PerDriver,
		PerNode:     cfg.Budgets.PerNode,
		BackoffBase: cfg.Backoff.Base,
		BackoffMax:  cfg.Backoff.Max,
		// A task is a probe, a heal and a confirming probe.
		DefaultTimeout: 2*cfg.Timeouts.Probe + cfg.Timeouts.Heal,
		Metrics:        dispatch.NewMetrics(k.reg),
	}
	var guard func(context.Context) (context.Context, func(), error)
	if lease != nil {
		dispatchOpts.Lease = lease
		guard = lease.Guard
	}
	plan := planner.New(plannerCaches)
	sidecars, clientCert, err := sidecarClient(cfg, k.clientset.CoreV1(), guard, plan.PersistentVolume, signerRoots)
	if err != nil {
		return nil, err
	}
	dispatcher, err := dispatch.New(dispatchOpts)
	if err != nil {
		return nil, err
	}
	a := &actStage{dispatcher: dispatcher, sidecars: sidecars, clientCert: clientCert, targets: healer.NewTargetMap(), metrics: healer.NewMetrics(k.reg)}
	containers := containerRestarter{targets: a.targets, sidecars: sidecars}
	if a.evictor, err = newEvictor(cfg, k, engine, containers, func(req evict.Request) { a.submit(reprobeSweep(req)) }); err != nil {
		return nil, err
	}
	a.sweeper, err = healer.New(healer.Options{
		Planner:    plan,
		Policy:     engine,
		Sidecars:   sidecars,
		Dispatcher: dispatcher,
		Targets:    a.targets,
		Client:     k.apiClient,
		Recorder:   k.recorder,
		Metrics:    a.metrics,
		DryRun:     cfg.DryRun,
		// An incomplete restart sweep is tried again on the same backoff as a failing volume.
		RetryBase: cfg.Backoff.Base,
		RetryMax:  cfg.Backoff.Max,
		Restarter: restarter(a.evictor),
		// A recycle evicts: only where evictions are on and really made.
		Evict: cfg.Remediation.Enabled && !cfg.Remediation.DryRun && !cfg.DryRun,
	})
	if err != nil {
		return nil, err
	}
	k.reg.MustRegister(a.sweeper)
	return a, nil
}

// newEvictor builds the evictor of the pods on a healed volume, or returns nil when remediation is
// off. Its metrics are exposed with remediation off too, at zero, so that the dashboard and the
// alerts read the same series whatever the setting.
func newEvictor(cfg *config.Config, k *kube, engine *policy.Engine, containers evict.ContainerRestarter, reprobe func(evict.Request)) (*evict.Evictor, error) {
	evictMetrics := evict.NewMetrics(k.reg)
	if !cfg.Remediation.Enabled {
		return nil, nil
	}
	return evict.New(evict.Options{
		Client:                k.clientset,
		Policy:                engine,
		Recorder:              k.recorder,
		Metrics:               evictMetrics,
		DryRun:                cfg.Remediation.DryRun || cfg.DryRun,
		PerMinute:             cfg.Remediation.EvictionsPerMinute,
		PerNamespacePerMinute: cfg.Remediation.EvictionsPerNamespacePerMinute,
		// A blocked eviction is tried again on the same backoff as a failing volume.
		BackoffBase:  cfg.Backoff.Base,
		BackoffMax:   cfg.Backoff.Max,
		Reprobe:      reprobe,
		ReprobeAfter: cfg.Remediation.ReprobeAfter,
		Containers:   containers,
	})
}

// containerRestarter restarts a pod's containers in place through the sidecar that serves the
// pod's node now.
type containerRestarter struct {
	targets  *healer.TargetMap
	sidecars *probe.Client
}

var _ evict.ContainerRestarter = containerRestarter{}

// RestartContainers calls RestartContainers on the sidecar of driver on node.
func (c containerRestarter) RestartContainers(ctx context.Context, driver, node, pv, podUID string) ([]string, error) {
	t, _, err := c.targets.Target(driver, node)
	if err != nil {
		return nil, fmt.Errorf("restarting the containers of pod %s: %w", podUID, err)
	}
	return c.sidecars.RestartContainers(ctx, t, pv, podUID)
}

// leadership is the runnable, on every replica, that tells the healer metrics and the policy
// source when this replica becomes the leader; the source then reports its rejections again.
func leadership(mgr manager.Manager, metrics *healer.Metrics, pol *policyStage) manager.Runnable {
	return manager.RunnableFunc(func(ctx context.Context) error {
		metrics.SetLeader(false)
		select {
		case <-mgr.Elected():
			metrics.SetLeader(true)
			pol.leading.Store(true)
			pol.source.Resync()
		case <-ctx.Done():
		}
		return nil
	})
}

// newSweepRunner builds the runner of the sweeps the triggers fire, which starts them once the
// caches are full and the policy is read.
func newSweepRunner(sweeper *healer.Sweeper, factory informers.SharedInformerFactory, source *policy.ConfigMapSource) *sweepRunner {
	return &sweepRunner{sweeper: sweeper, ready: func(ctx context.Context) error {
		// A sweep planned from caches still filling would find no volumes and, for a restart,
		// record the marker as handled: the restart would be lost. The policy ConfigMaps must be
		// read too, or the first sweeps would run on the built-in policy.
		return wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
			return informersSynced(factory) == nil && source.HasSynced(), nil
		})
	}}
}

// newTriggers builds the restart, periodic and manual triggers, which hand their sweeps to submit.
func newTriggers(cfg *config.Config, k *kube, submit func(scheduler.Sweep)) (triggers, error) {
	schedMetrics := trigger.NewMetrics(k.reg)
	restarts, err := trigger.NewRestarts(trigger.RestartOptions{
		Debounce: cfg.Restart.Debounce,

		SweepCSIAddonsSidecarRestarts: cfg.Restart.SweepCSIAddonsSidecarRestarts,
		Metrics:                       schedMetrics,
		Sweeps:                        submit,
	})
	if err != nil {
		return triggers{}, err
	}
	periodic, err := trigger.NewPeriodic(trigger.PeriodicOptions{
		Default:        cfg.Schedule.Default,
		StorageClasses: cfg.Schedule.StorageClasses,
		Stagger:        cfg.Schedule.Stagger,
		Recorder:       k.recorder,
		Metrics:        schedMetrics,
		Sweeps:         submit,
	})
	if err != nil {
		return triggers{}, err
	}
	manual, err := trigger.NewManual(trigger.ManualOptions{
		Metrics:               schedMetrics,
		Sweeps:                submit,
		PerMinute:             cfg.ManualSweeps.PerMinute,
		PerNamespacePerMinute: cfg.ManualSweeps.PerNamespacePerMinute,
	})
	if err != nil {
		return triggers{}, err
	}
	return triggers{restarts, periodic, manual}, nil
}

// addRunnables adds the long-running parts to the manager. The informers and the policy source run
// on every replica, so a new leader starts warm; the dispatcher, the triggers, the sweeps and the
// evictor run on the leader only.
func addRunnables(mgr manager.Manager, factory informers.SharedInformerFactory, handlers []toolscache.ResourceEventHandlerRegistration, budget *heapBudget,
	source *policy.ConfigMapSource, act *actStage, sweeps *sweepRunner, t triggers) error {
	if err := mgr.AddReadyzCheck("informers", func(*http.Request) error {
		return informersSynced(factory)
	}); err != nil {
		return err
	}
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
		manager.RunnableFunc(source.Start),
	} {
		if err := mgr.Add(everyReplica{r}); err != nil {
			return err
		}
	}
	for _, r := range []manager.Runnable{act.dispatcher, sweeps, t.restarts, t.periodic, t.manual} {
		if err := mgr.Add(r); err != nil {
			return err
		}
	}
	if act.clientCert != nil {
		if err := mgr.Add(act.clientCert); err != nil {
			return err
		}
	}
	if act.evictor != nil {
		return mgr.Add(act.evictor)
	}
	return nil
}

// start runs the manager until ctx ends or a part fails. With leader election it then ends the
// leadership: the process returns only once the calls to sidecars in flight have.
func start(ctx context.Context, cfg *config.Config, mgr manager.Manager, lease *leader.Lease) error {
	logger := klog.FromContext(ctx)
	logger.Info("Starting volume-healer", "leaderElection", cfg.LeaderElection.Enabled, "dryRun", cfg.DryRun, "webhook", cfg.Webhook.Enabled, "propagationWebhook", cfg.PropagationWebhook.Enabled,
		"remediation", cfg.Remediation.Enabled, "remediationDryRun", cfg.Remediation.DryRun)
	err := mgr.Start(ctx)
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

// reprobeSweep is the sweep that probes req's volume again once the pods on its dead mount were
// evicted: a manual sweep of that one PV, dispatched under the budgets like any other.
func reprobeSweep(req evict.Request) scheduler.Sweep {
	return scheduler.Sweep{Trigger: scheduler.TriggerManual, PV: req.PV, AfterEviction: true}
}

// restarter is the sweeper's Restarter: the evictor, or none when remediation is off (a nil
// *evict.Evictor in the interface would not be nil).
func restarter(e *evict.Evictor) healer.Restarter {
	if e == nil {
		return nil
	}
	return e
}
