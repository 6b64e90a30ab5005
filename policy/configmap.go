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
	// DefaultPolicySelector selects policy ConfigMaps unless configured otherwise. During the
	// release after 0.1.0 it also selects the ConfigMaps labelled for 0.1.0 (Selectors).
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
	// LabelSelector selects the policy ConfigMaps, as Selectors reads it. Default
	// DefaultPolicySelector.
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
	// LastGoodName names the ConfigMap, in Namespace and without the policy label, where the
	// leader keeps a copy of the last accepted policy set. A replica that starts while the
	// configured set is rejected serves that copy; without one it skips every volume until the
	// set is fixed. Default DefaultLastGoodName.
	LastGoodName string
}

// DefaultLastGoodName is the ConfigMap that holds the last accepted policy set.
const DefaultLastGoodName = "volume-healer-last-good-policy"

// lastGoodKey is the data key of the last-good copy: the set's modules as JSON.
const lastGoodKey = "modules.json"

// failClosedFile names the one module of the fail-closed policy.
const failClosedFile = "volume-healer/fail-closed.rego"

// failClosedModules serve when the configured policy set is rejected at start and no accepted
// copy can be read: the engine decides nothing while they serve (Engine.Decide returns
// ErrNoAcceptedPolicy), so every volume the policy would have governed is left alone and a
// restart sweep stays pending. The rule below only keeps the module a valid policy.
func failClosedModules() []Module {
	return []Module{{File: failClosedFile, Text: "package volumehealer\n\n" +
		"# The configured policy is rejected and no accepted copy of it can be read: decide nothing.\n" +
		`decision := {"action": "skip", "reason": "PolicyRejected"}` + "\n"}}
}

// failClosed reports whether r is the fail-closed policy.
func (r *Revision) failClosed() bool { return len(r.files) == 1 && r.files[0] == failClosedFile }

func (o ConfigMapOptions) withDefaults() ConfigMapOptions {
	if o.Namespace == "" {
		o.Namespace = DefaultPolicyNamespace
	}
	if o.LabelSelector == "" {
		o.LabelSelector = DefaultPolicySelector
	}
	if o.LastGoodName == "" {
		o.LastGoodName = DefaultLastGoodName
	}
	return o
}

// ConfigMapSource feeds an Engine from ConfigMaps: every data key ending in .rego of every
// selected ConfigMap is one module, and all of them form one policy set. When none exists the
// built-in default serves. A set that is rejected leaves the last good revision serving; the
// offending ConfigMaps get a status annotation and a Warning Event.
type ConfigMapSource struct {
	client kubernetes.Interface
	engine *Engine
	opts   ConfigMapOptions
	// selectors select the policy ConfigMaps: a ConfigMap matching one of them is one.
	selectors []labels.Selector
	synced    atomic.Bool

	// Set by Watch.
	informer cache.SharedIndexInformer
	lister   corelisters.ConfigMapLister
	queue    workqueue.TypedRateLimitingInterface[string]

	// Touched by the single worker only.
	attemptedID string // the set last handed to the engine
	attemptErr  error  // its outcome
	// configured is set once the engine serves what the configuration says: an accepted set, or
	// at start with a rejected set, the last-good copy or the fail-closed policy.
	configured bool
	// savedID is the set last written to the last-good copy.
	savedID string
	// failClosed is set while the fail-closed policy serves because the last-good copy could
	// not be read; each sync reads it again, and a failed read is retried with backoff.
	failClosed bool
}

// NewConfigMapSource returns a source that loads the policy ConfigMaps into engine once started.
func NewConfigMapSource(client kubernetes.Interface, engine *Engine, opts ConfigMapOptions) (*ConfigMapSource, error) {
	opts = opts.withDefaults()
	sels, err := Selectors(opts.LabelSelector)
	if err != nil {
		return nil, err
	}
	return &ConfigMapSource{client: client, engine: engine, opts: opts, selectors: sels}, nil
}

// Selectors parses the label selector of the policy ConfigMaps. The default selector, written
// with this release's policy label or with the one of 0.1.0, selects the ConfigMaps that carry
// either label, so that a ConfigMap labelled for 0.1.0 stays a policy ConfigMap: one label
// selector cannot match either of two keys, so there is one per key, the current one first.
// Another selector is the one selector.
func Selectors(selector string) ([]labels.Selector, error) {
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, fmt.Errorf("policy ConfigMap label selector %q: %w", selector, err)
	}
	var defaults []labels.Selector
	for _, key := range annotations.Keys(annotations.PolicyLabel) {
		defaults = append(defaults, labels.SelectorFromSet(labels.Set{key: annotations.PolicyLabelValue}))
	}
	for _, d := range defaults {
		if d.String() == sel.String() {
			return defaults, nil
		}
	}
	return []labels.Selector{sel}, nil
}

// Watch registers the source's ConfigMap informer on factory, the process's one shared informer
// factory, which the caller starts. Start needs it. The informer holds the policy namespace's
// ConfigMaps that the label selector selects; with two selectors (Selectors), every ConfigMap of
// the namespace, of which the source reads the selected ones.
func (s *ConfigMapSource) Watch(factory informers.SharedInformerFactory) error {
	s.informer = factory.InformerFor(&corev1.ConfigMap{}, func(client kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredConfigMapInformer(client, s.opts.Namespace, s.opts.ResyncPeriod, cache.Indexers{},
			func(o *metav1.ListOptions) {
				if len(s.selectors) == 1 {
					o.LabelSelector = s.selectors[0].String()
				}
			})
	})
	s.lister = corelisters.NewConfigMapLister(s.informer.GetIndexer())
	s.queue = workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "policy-configmaps"})
	enqueue := func(any) { s.queue.Add(queueKey) }
	// A ConfigMap that stops matching (its label removed) comes as a delete.
	if _, err := s.informer.AddEventHandler(cache.FilteringResourceEventHandler{
		FilterFunc: func(obj any) bool {
			if gone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = gone.Obj
			}
			cm, ok := obj.(*corev1.ConfigMap)
			return !ok || s.selects(cm)
		},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    enqueue,
			UpdateFunc: func(_, obj any) { enqueue(obj) },
			DeleteFunc: enqueue,
		},
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
	cms, err := s.list()
	if err != nil {
		return err
	}
	modules := ModulesFromConfigMaps(cms)
	setID := "builtin"
	switch {
	case len(modules) > 0:
		setID = revisionID(modules)
	case len(cms) > 0:
		setID = "no-modules"
	}

	// lastGoodErr says why the last-good copy could not be read; the sync is then retried.
	var lastGoodErr error
	if setID == s.attemptedID && s.attemptErr != nil && s.failClosed {
		lastGoodErr = s.serveLastGood(ctx)
	}
	if setID != s.attemptedID {
		var rev *Revision
		switch {
		case len(modules) > 0:
			rev, err = s.engine.Load(ctx, modules)
		case len(cms) > 0:
			// Labelled ConfigMaps without Rego: a key removed or renamed by mistake must not turn
			// a site policy into the built-in one.
			err = noModulesError(len(cms))
			s.engine.opts.Metrics.loadError(KindNoModules)
		default:
			rev, err = s.engine.LoadDefault(ctx)
		}
		var le *LoadError
		if err != nil && !errors.As(err, &le) {
			return fmt.Errorf("loading policy: %w", err) // not the policy's fault (a cancelled context): retry
		}
		s.attemptedID, s.attemptErr = setID, err
		if err != nil {
			if !s.configured || s.failClosed {
				lastGoodErr = s.serveLastGood(ctx)
			}
			logger.Error(err, "Policy rejected; the previous revision keeps serving", "revision", s.engine.Revision().ID())
			if s.leading() {
				s.recordRejection(cms, le)
			}
		} else {
			s.configured, s.failClosed = true, false
			logger.Info("Policy applied", "revision", rev.ID(), "configMaps", len(cms), "modules", len(modules), "builtin", len(modules) == 0)
		}
	}
	if s.attemptErr == nil && s.leading() && s.savedID != setID {
		if err := s.saveLastGood(ctx, modules); err != nil {
			logger.Error(err, "Cannot keep a copy of the accepted policy; a restart while a broken policy is configured would skip every volume")
		} else {
			s.savedID = setID
		}
	}
	// The ConfigMaps found are applied (or rejected) even if writing a status below fails.
	s.synced.Store(true)
	if !s.leading() {
		return lastGoodErr
	}

	errs := []error{lastGoodErr}
	for _, cm := range cms {
		if err := s.writeStatus(ctx, cm, s.statusOf(cm, cms)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// noModulesError rejects n labelled ConfigMaps none of which holds a data key ending in .rego.
func noModulesError(n int) *LoadError {
	return &LoadError{Kind: KindNoModules, Err: fmt.Errorf(
		"%d policy ConfigMap(s) carry the label but no data key ending in .rego; delete them (or remove the label) to serve the built-in policy", n)}
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
	if len(out) == 0 {
		// No ConfigMap holds Rego (KindNoModules): each of them is the problem.
		out = cms
	}
	return out
}

func (s *ConfigMapSource) recordRejection(cms []*corev1.ConfigMap, le *LoadError) {
	if s.opts.Recorder == nil {
		return
	}
	for _, cm := range offending(cms, le) {
		s.opts.Recorder.Eventf(cm, corev1.EventTypeWarning, ReasonPolicyRejected,
			"Policy rejected, revision %s keeps serving%s: %s", s.engine.Revision().ID(), s.fallbackNote(), truncate(le.Error(), maxStatusError))
	}
}

// statusOf is the status cm should carry after the last attempt.
func (s *ConfigMapSource) statusOf(cm *corev1.ConfigMap, cms []*corev1.ConfigMap) PolicyStatus {
	var le *LoadError
	if errors.As(s.attemptErr, &le) && le.Kind == KindNoModules {
		return PolicyStatus{Status: StatusRejected, Reason: le.Kind, Error: truncate(le.Err.Error(), maxStatusError)}
	}
	if len(regoKeys(cm)) == 0 {
		return PolicyStatus{Status: StatusIgnored, Error: "no data key ends in .rego"}
	}
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
	_, previous := cm.Annotations[annotations.Previous(annotations.PolicyStatus)]
	if cm.Annotations[annotations.PolicyStatus] == string(value) && !previous {
		return nil
	}
	patch := annotations.MergePatch(map[string]string{annotations.PolicyStatus: string(value)})
	_, err = s.client.CoreV1().ConfigMaps(cm.Namespace).Patch(ctx, cm.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("writing policy status to ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return nil
}

// fallbackNote says what serves when it is not a set this process accepted.
func (s *ConfigMapSource) fallbackNote() string {
	if s.engine.Revision().failClosed() {
		return " (no accepted policy to fall back on: no volume is decided, and restart sweeps stay pending, until the policy is fixed)"
	}
	return ""
}

// serveLastGood runs when the configured set is rejected before this process served anything of
// the configuration (a controller restart or a new replica while a broken policy is in place):
// the engine still serves the built-in policy, which must not stand in for the site's. It serves
// the last accepted set that the leader kept, or, without one, the fail-closed policy, which
// decides nothing. Either way the rejection stays visible (volume_healer_policy_rejected). It
// returns an error when the copy could not be read, so that the read is tried again.
func (s *ConfigMapSource) serveLastGood(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	modules, err := s.readLastGood(ctx)
	readErr := err
	switch {
	case err != nil:
		logger.Error(err, "Cannot read the accepted copy of the policy; no volume is decided until it is read or the policy is fixed")
	case modules == nil:
		logger.Info("No accepted copy of the policy exists; no volume is decided until the policy is fixed")
	default:
		var rev *Revision
		if len(modules) == 0 {
			rev, err = s.engine.LoadDefault(ctx)
		} else {
			rev, err = s.engine.Load(ctx, modules)
		}
		if err == nil {
			s.configured, s.failClosed = true, false
			s.engine.opts.Metrics.markRejected()
			logger.Info("The configured policy is rejected; serving the last accepted copy", "revision", rev.ID(), "copy", s.opts.Namespace+"/"+s.opts.LastGoodName)
			return nil
		}
		logger.Error(err, "The accepted copy of the policy does not load; no volume is decided until the policy is fixed")
	}
	if _, err := s.engine.Load(ctx, failClosedModules()); err != nil {
		// The fail-closed policy is one constant line; not loading it is a bug, and the built-in
		// policy keeps serving.
		logger.Error(err, "Cannot load the fail-closed policy")
		return readErr
	}
	s.configured = true
	s.failClosed = readErr != nil
	s.engine.opts.Metrics.markRejected()
	return readErr
}

// readLastGood returns the modules of the last-good copy: nil when there is none, empty when the
// last accepted set was the built-in policy.
func (s *ConfigMapSource) readLastGood(ctx context.Context) ([]Module, error) {
	cm, err := s.client.CoreV1().ConfigMaps(s.opts.Namespace).Get(ctx, s.opts.LastGoodName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading ConfigMap %s/%s: %w", s.opts.Namespace, s.opts.LastGoodName, err)
	}
	modules := []Module{}
	if err := json.Unmarshal([]byte(cm.Data[lastGoodKey]), &modules); err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s: data key %s: %w", s.opts.Namespace, s.opts.LastGoodName, lastGoodKey, err)
	}
	return modules, nil
}

// saveLastGood writes modules, just accepted, as the last-good copy (none: the built-in policy).
func (s *ConfigMapSource) saveLastGood(ctx context.Context, modules []Module) error {
	if modules == nil {
		modules = []Module{}
	}
	text, err := json.Marshal(modules)
	if err != nil {
		return err
	}
	cms := s.client.CoreV1().ConfigMaps(s.opts.Namespace)
	data := map[string]string{lastGoodKey: string(text)}
	_, err = cms.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: s.opts.LastGoodName,
			Annotations: map[string]string{annotations.PolicyLastGoodRevision: s.engine.Revision().ID()}},
		Data: data,
	}, metav1.CreateOptions{FieldManager: fieldManager})
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	// The revision under its key, and none under the key of 0.1.0.
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{
			annotations.PolicyLastGoodRevision:                       s.engine.Revision().ID(),
			annotations.Previous(annotations.PolicyLastGoodRevision): nil,
		}},
		"data": data,
	})
	if err != nil {
		return err
	}
	_, err = cms.Patch(ctx, s.opts.LastGoodName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
	return err
}
