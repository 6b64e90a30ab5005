package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/api/annotations"
)

const (
	// DefaultPolicyNamespace is where policy ConfigMaps live unless configured otherwise.
	DefaultPolicyNamespace = "volume-healer"
	// DefaultPolicySelector selects policy ConfigMaps unless configured otherwise.
	DefaultPolicySelector = annotations.PolicySelector
	// ReasonPolicyRejected is the reason of the Warning Event emitted on a ConfigMap whose policy
	// was rejected.
	ReasonPolicyRejected = "PolicyRejected"

	// fieldManager names the controller in server-side field ownership.
	fieldManager = "volume-healer"
	// maxStatusError bounds the error text in the annotation and Event.
	maxStatusError = 1024
	// queueKey is the one work item: any change re-reads every selected ConfigMap.
	queueKey = "policy-set"
)

// PolicyStatus values.
const (
	// StatusOK means the ConfigMap's modules are part of the serving revision.
	StatusOK = "ok"
	// StatusRejected means the ConfigMap's modules caused the policy set to be rejected.
	StatusRejected = "rejected"
	// StatusBlocked means the ConfigMap is fine but another ConfigMap of the set was rejected, so
	// none of the set serves.
	StatusBlocked = "blocked"
	// StatusIgnored means the ConfigMap carries the policy label but no data key ending in .rego.
	StatusIgnored = "ignored"
)

// PolicyStatus is the value of annotations.PolicyStatus, as JSON.
type PolicyStatus struct {
	// Status is ok, rejected, blocked or ignored.
	Status string `json:"status"`
	// Revision is the serving revision when Status is ok.
	Revision string `json:"revision,omitempty"`
	// Reason is the kind of error when Status is rejected.
	Reason ErrorKind `json:"reason,omitempty"`
	// Error explains a status other than ok, with file (namespace/configmap/key) and line.
	Error string `json:"error,omitempty"`
}

// ConfigMapOptions configure a ConfigMapSource.
type ConfigMapOptions struct {
	// Namespace holds the policy ConfigMaps. Default DefaultPolicyNamespace.
	Namespace string
	// LabelSelector selects the policy ConfigMaps. Default DefaultPolicySelector.
	LabelSelector string
	// Recorder emits the PolicyRejected Events. Default nil: no Events.
	Recorder record.EventRecorder
	// Leading reports whether this replica leads. Every replica loads the policy, so that a new
	// leader starts with it, but only the leader writes the status annotations and the
	// PolicyRejected Events, so that a rejection is reported once; call Resync when this replica
	// becomes the leader. Default nil: this replica always writes.
	Leading func() bool
	// ResyncPeriod re-reads every ConfigMap from the informer cache this often. Default 0: only on
	// change, which suffices because the source is level-driven.
	ResyncPeriod time.Duration
}

func (o ConfigMapOptions) withDefaults() ConfigMapOptions {
	if o.Namespace == "" {
		o.Namespace = DefaultPolicyNamespace
	}
	if o.LabelSelector == "" {
		o.LabelSelector = DefaultPolicySelector
	}
	return o
}

// ConfigMapSource feeds an Engine from ConfigMaps: every data key ending in .rego of every
// selected ConfigMap is one module, and all of them form one policy set. When none exists the
// built-in default serves. A set that is rejected leaves the last good revision serving; the
// offending ConfigMaps get a status annotation and a Warning Event.
type ConfigMapSource struct {
	client   kubernetes.Interface
	engine   *Engine
	opts     ConfigMapOptions
	selector labels.Selector
	synced   atomic.Bool

	// Set by Watch.
	informer cache.SharedIndexInformer
	lister   corelisters.ConfigMapLister
	queue    workqueue.TypedRateLimitingInterface[string]

	// Touched by the single worker only.
	attemptedID string // the set last handed to the engine
	attemptErr  error  // its outcome
}

// NewConfigMapSource returns a source that loads the policy ConfigMaps into engine once started.
func NewConfigMapSource(client kubernetes.Interface, engine *Engine, opts ConfigMapOptions) (*ConfigMapSource, error) {
	opts = opts.withDefaults()
	sel, err := labels.Parse(opts.LabelSelector)
	if err != nil {
		return nil, fmt.Errorf("policy ConfigMap label selector %q: %w", opts.LabelSelector, err)
	}
	return &ConfigMapSource{client: client, engine: engine, opts: opts, selector: sel}, nil
}

// Watch registers the source's ConfigMap informer (the policy namespace and label selector only)
// on factory, the process's one shared informer factory, which the caller starts. Start needs it.
func (s *ConfigMapSource) Watch(factory informers.SharedInformerFactory) error {
	s.informer = factory.InformerFor(&corev1.ConfigMap{}, func(client kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredConfigMapInformer(client, s.opts.Namespace, s.opts.ResyncPeriod, cache.Indexers{},
			func(o *metav1.ListOptions) { o.LabelSelector = s.opts.LabelSelector })
	})
	s.lister = corelisters.NewConfigMapLister(s.informer.GetIndexer())
	s.queue = workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "policy-configmaps"})
	enqueue := func(any) { s.queue.Add(queueKey) }
	if _, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		return fmt.Errorf("watching policy ConfigMaps: %w", err)
	}
	return nil
}

// leading reports whether this replica writes statuses and Events (ConfigMapOptions.Leading).
func (s *ConfigMapSource) leading() bool { return s.opts.Leading == nil || s.opts.Leading() }

// Resync applies the ConfigMaps again and writes their statuses; the controller calls it when
// its replica becomes the leader, so that statuses written by no replica while it led get written.
func (s *ConfigMapSource) Resync() {
	if s.queue != nil {
		s.queue.Add(queueKey)
	}
}

// HasSynced reports whether the source has applied the ConfigMaps found at start; until then the
// engine serves the built-in default.
func (s *ConfigMapSource) HasSynced() bool { return s.synced.Load() }

// Start applies the policy ConfigMaps, and every change to them, until ctx is done. The informer
// that Watch registered must be started by its factory (before or after Start).
func (s *ConfigMapSource) Start(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("policy")
	ctx = klog.NewContext(ctx, logger)

	if s.informer == nil {
		return errors.New("policy: ConfigMapSource started before Watch registered its informer")
	}
	queue := s.queue
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced) {
		return nil // ctx is done
	}
	logger.V(2).Info("Watching policy ConfigMaps", "namespace", s.opts.Namespace, "selector", s.opts.LabelSelector)
	queue.Add(queueKey)

	for {
		key, shutdown := queue.Get()
		if shutdown {
			return nil
		}
		if err := s.sync(ctx); err != nil {
			logger.Error(err, "Applying policy ConfigMaps failed; retrying")
			queue.AddRateLimited(key)
		} else {
			queue.Forget(key)
		}
		queue.Done(key)
	}
}

// ModulesFromConfigMaps returns the policy modules of the ConfigMaps: every data key ending in
// .rego, named namespace/configmap/key, in a stable order.
func ModulesFromConfigMaps(cms []*corev1.ConfigMap) []Module {
	sorted := slices.Clone(cms)
	slices.SortFunc(sorted, func(a, b *corev1.ConfigMap) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	var mods []Module
	for _, cm := range sorted {
		for _, key := range regoKeys(cm) {
			mods = append(mods, Module{File: moduleFile(cm, key), Text: cm.Data[key]})
		}
	}
	return mods
}

func regoKeys(cm *corev1.ConfigMap) []string {
	var keys []string
	for k := range cm.Data {
		if strings.HasSuffix(k, ".rego") {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

func moduleFile(cm *corev1.ConfigMap, key string) string {
	return cm.Namespace + "/" + cm.Name + "/" + key
}

// sync loads the selected ConfigMaps into the engine unless that set was tried already, then
// brings every ConfigMap's status annotation in line with the outcome.
func (s *ConfigMapSource) sync(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	cms, err := s.lister.ConfigMaps(s.opts.Namespace).List(s.selector)
	if err != nil {
		return fmt.Errorf("listing policy ConfigMaps: %w", err)
	}
	modules := ModulesFromConfigMaps(cms)
	setID := "builtin"
	if len(modules) > 0 {
		setID = revisionID(modules)
	}

	if setID != s.attemptedID {
		var rev *Revision
		if len(modules) == 0 {
			rev, err = s.engine.LoadDefault(ctx)
		} else {
			rev, err = s.engine.Load(ctx, modules)
		}
		var le *LoadError
		if err != nil && !errors.As(err, &le) {
			return fmt.Errorf("loading policy: %w", err) // not the policy's fault (a cancelled context): retry
		}
		s.attemptedID, s.attemptErr = setID, err
		if err != nil {
			logger.Error(err, "Policy rejected; the previous revision keeps serving", "revision", s.engine.Revision().ID())
			if s.leading() {
				s.recordRejection(cms, le)
			}
		} else {
			logger.Info("Policy applied", "revision", rev.ID(), "configMaps", len(cms), "modules", len(modules), "builtin", len(modules) == 0)
		}
	}
	// The ConfigMaps found are applied (or rejected) even if writing a status below fails.
	s.synced.Store(true)
	if !s.leading() {
		return nil
	}

	var errs []error
	for _, cm := range cms {
		if err := s.writeStatus(ctx, cm, s.statusOf(cm, cms)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// offending returns the ConfigMaps a rejection points at: those holding a file the error names, or
// every ConfigMap of the set when the error names none of theirs.
func offending(cms []*corev1.ConfigMap, le *LoadError) []*corev1.ConfigMap {
	var out []*corev1.ConfigMap
	for _, cm := range cms {
		for _, key := range regoKeys(cm) {
			if slices.Contains(le.Files, moduleFile(cm, key)) {
				out = append(out, cm)
				break
			}
		}
	}
	if len(out) == 0 {
		for _, cm := range cms {
			if len(regoKeys(cm)) > 0 {
				out = append(out, cm)
			}
		}
	}
	return out
}

func (s *ConfigMapSource) recordRejection(cms []*corev1.ConfigMap, le *LoadError) {
	if s.opts.Recorder == nil {
		return
	}
	for _, cm := range offending(cms, le) {
		s.opts.Recorder.Eventf(cm, corev1.EventTypeWarning, ReasonPolicyRejected,
			"Policy rejected, revision %s keeps serving: %s", s.engine.Revision().ID(), truncate(le.Error(), maxStatusError))
	}
}

// statusOf is the status cm should carry after the last attempt.
func (s *ConfigMapSource) statusOf(cm *corev1.ConfigMap, cms []*corev1.ConfigMap) PolicyStatus {
	if len(regoKeys(cm)) == 0 {
		return PolicyStatus{Status: StatusIgnored, Error: "no data key ends in .rego"}
	}
	var le *LoadError
	if !errors.As(s.attemptErr, &le) {
		return PolicyStatus{Status: StatusOK, Revision: s.engine.Revision().ID()}
	}
	bad := offending(cms, le)
	if slices.Contains(bad, cm) {
		return PolicyStatus{Status: StatusRejected, Reason: le.Kind, Error: truncate(le.Err.Error(), maxStatusError)}
	}
	var names []string
	for _, b := range bad {
		names = append(names, b.Namespace+"/"+b.Name)
	}
	return PolicyStatus{Status: StatusBlocked, Error: "the policy set is rejected because of ConfigMap " + strings.Join(names, ", ")}
}

// writeStatus patches the status annotation when it differs.
func (s *ConfigMapSource) writeStatus(ctx context.Context, cm *corev1.ConfigMap, status PolicyStatus) error {
	value, err := json.Marshal(status)
	if err != nil {
		return fmt.Errorf("encoding policy status: %w", err)
	}
	if cm.Annotations[annotations.PolicyStatus] == string(value) {
		return nil
	}
	patch := annotations.MergePatch(map[string]string{annotations.PolicyStatus: string(value)})
	_, err = s.client.CoreV1().ConfigMaps(cm.Namespace).Patch(ctx, cm.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("writing policy status to ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return nil
}
