package sidecar

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
)

// DefaultCSIAddonsNodeName is the name of the CSIAddonsNode the sidecar creates when it finds
// none for its driver and node: "<node>-<driver>", with every character that a Kubernetes name
// cannot hold (dots included) replaced by "-", lower case, and shortened with a hash suffix
// beyond 253 characters.
func DefaultCSIAddonsNodeName(node, driver string) string {
	base := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return '-'
	}, node+"-"+driver)
	base = strings.Trim(base, "-")
	const maxLen = 253
	if len(base) <= maxLen {
		return base
	}
	sum := sha256.Sum256([]byte(node + "\x00" + driver))
	suffix := hex.EncodeToString(sum[:5])
	return strings.TrimRight(base[:maxLen-len(suffix)-1], "-") + "-" + suffix
}

// registrar creates or updates the sidecar's CSIAddonsNode once per start.
type registrar struct {
	client client.Client
	// watcher watches the registered object, to keep the annotations on it (keep). Nil: no keep.
	watcher    client.WithWatch
	namespace  string
	name       string // CSIAddonsNodeName; empty: look up, then the default
	nodeName   string
	podUID     string
	endpoint   string
	clock      clock.WithTicker
	backoff    time.Duration
	maxBackoff time.Duration
	// csiAddonsWait bounds the wait of a start's first registration for the csi-addons sidecar
	// of the same pod (awaitCSIAddons); 0: no wait.
	csiAddonsWait time.Duration

	// writeMu serializes the writes of the sidecar's annotations on the registered object: run's
	// and keep's. A write of run and the marker it makes current are one step under it, so that
	// keep never sees run's new marker on the object before it is current (and puts the previous
	// one back, which the controller has recorded as handled: the restart would never be swept),
	// and never writes a marker that run has replaced.
	writeMu sync.Mutex
	// mu guards the registration that keep maintains: the object and the marker of the latest
	// successful run.
	mu            sync.Mutex
	currentName   string
	currentMarker string
	// currentRV is the resourceVersion that the latest registration's write returned, from which
	// keep's first watch starts; empty when unknown.
	currentRV string
}

// currentState returns the object, marker and resourceVersion of the latest successful
// registration.
func (r *registrar) currentState() (name, marker, rv string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.currentName, r.currentMarker, r.currentRV
}

// current returns the object and marker of the latest successful registration.
func (r *registrar) current() (name, marker string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.currentName, r.currentMarker
}

// run registers, retrying with exponential backoff until it works or ctx is done. The marker is
// chosen once, so that all retries write the same value.
func (r *registrar) run(ctx context.Context, driverName string) (string, error) {
	log := klog.FromContext(ctx)
	marker := annotations.HealerRestartValue(r.clock.Now(), r.podUID)
	// keep restores the current marker whenever the object shows another: it must know the new
	// one before the object does, or it would put the old one back over it.
	r.mu.Lock()
	r.currentMarker = marker
	r.mu.Unlock()
	r.awaitCSIAddons(ctx)
	retries := retryBackoff(r.backoff, r.maxBackoff)
	for {
		name, matches, err := r.registerCurrent(ctx, driverName, marker)
		if err == nil {
			log.Info("CSIAddonsNode registered", "csiAddonsNode", klog.KRef(r.namespace, name), "marker", marker, "endpoint", r.endpoint)
			if r.name != "" {
				// The object was named, not looked up: the others this sidecar wrote its endpoint
				// on carry its label, and a selector lists them alone.
				if matches, err = r.labelled(ctx, driverName); err != nil {
					log.Error(err, "Cannot look for other CSIAddonsNodes of this driver and node")
					return name, nil
				}
			}
			r.converge(ctx, name, matches)
			return name, nil
		}
		retryIn := retries.Step()
		log.Error(err, "Cannot register the CSIAddonsNode; retrying", "retryIn", retryIn)
		t := r.clock.NewTimer(retryIn)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", ctx.Err()
		case <-t.C():
		}
	}
}

// awaitCSIAddons waits, at most r.csiAddonsWait, until the named CSIAddonsNode carries the
// csi-addons sidecar's createdByPodUID of this pod: that sidecar reads its object and updates it
// once at its start, and when another write comes between the two (this sidecar's registration)
// the update conflicts and it tries again only minutes later, so that the object lacks its
// endpoint meanwhile. One watch of the object, which begins with the object as it is, tells
// when it has written; nothing is read per volume or polled.
func (r *registrar) awaitCSIAddons(ctx context.Context) {
	if r.csiAddonsWait <= 0 || r.name == "" || r.podUID == "" || r.watcher == nil {
		return
	}
	log := klog.FromContext(ctx).WithValues("csiAddonsNode", klog.KRef(r.namespace, r.name))
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := r.watcher.Watch(wctx, &csiaddonsv1alpha1.CSIAddonsNodeList{}, client.InNamespace(r.namespace), client.MatchingFields{"metadata.name": r.name})
	if err != nil {
		log.Error(err, "Cannot watch for the csi-addons sidecar's write of the CSIAddonsNode; registering without waiting for it")
		return
	}
	defer w.Stop()
	began := r.clock.Now()
	timer := r.clock.NewTimer(r.csiAddonsWait)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
			log.Info("The csi-addons sidecar of this pod has not written the CSIAddonsNode; registering anyway",
				"waited", r.csiAddonsWait, "podUID", r.podUID)
			return
		case ev, ok := <-w.ResultChan():
			if !ok || ev.Type == watch.Error {
				log.Info("The watch for the csi-addons sidecar's write of the CSIAddonsNode ended; registering without waiting further")
				return
			}
			n, isNode := ev.Object.(*csiaddonsv1alpha1.CSIAddonsNode)
			if isNode && ev.Type != watch.Deleted && n.Name == r.name && n.Annotations[annotations.CSIAddonsPod] == r.podUID {
				log.V(2).Info("The csi-addons sidecar of this pod has written the CSIAddonsNode", "after", r.clock.Since(began))
				return
			}
		}
	}
}

// retryBackoff spaces the sidecar's retries of a call that failed: base, doubling after each
// retry, at most ceiling.
func retryBackoff(base, ceiling time.Duration) wait.Backoff {
	return wait.Backoff{Duration: base, Factor: 2, Cap: ceiling, Steps: math.MaxInt}
}

// registerCurrent makes one attempt of run and, when it works, makes its object and marker the
// ones keep maintains, before keep may write again. It returns what register returns.
func (r *registrar) registerCurrent(ctx context.Context, driverName, marker string) (string, []csiaddonsv1alpha1.CSIAddonsNode, error) {
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	name, rv, matches, err := r.register(ctx, driverName, marker)
	if err != nil {
		return "", nil, err
	}
	r.mu.Lock()
	r.currentName, r.currentMarker, r.currentRV = name, marker, rv
	r.mu.Unlock()
	return name, matches, nil
}

// keep watches the registered CSIAddonsNode and puts the sidecar's annotations (the same marker
// and endpoint) back whenever they go missing: a csi-addons sidecar recreates a deleted object
// without them within a second, and an operator may remove them. Without them the controller
// would lose this sidecar's endpoint and dial the csi-addons one. It returns when ctx ends.
func (r *registrar) keep(ctx context.Context, driverName string) {
	name, _ := r.current()
	if r.watcher == nil || name == "" {
		return
	}
	log := klog.FromContext(ctx).WithValues("csiAddonsNode", klog.KRef(r.namespace, name))
	retries := retryBackoff(r.backoff, r.maxBackoff)
	// The first watch starts where the registration's write left the object, so that it sees
	// every change since and needs no read of it first.
	_, _, from := r.currentState()
	for ctx.Err() == nil {
		opts := []client.ListOption{client.InNamespace(r.namespace), client.MatchingFields{"metadata.name": name}}
		if from != "" {
			opts = append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: from}})
		}
		w, err := r.watcher.Watch(ctx, &csiaddonsv1alpha1.CSIAddonsNodeList{}, opts...)
		if err != nil {
			retryIn := retries.Step()
			log.Error(err, "Cannot watch the CSIAddonsNode; retrying", "retryIn", retryIn)
			if !r.sleep(ctx, retryIn) {
				return
			}
			continue
		}
		retries = retryBackoff(r.backoff, r.maxBackoff)
		if from == "" {
			// The object may have changed while no watch ran.
			r.restore(ctx, driverName)
		}
		from = ""
		r.follow(ctx, w, driverName, name)
		w.Stop()
	}
}

// follow handles the events of one watch until it ends.
func (r *registrar) follow(ctx context.Context, w watch.Interface, driverName, name string) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok || ev.Type == watch.Error {
				return
			}
			n, isNode := ev.Object.(*csiaddonsv1alpha1.CSIAddonsNode)
			if !isNode || n.Name != name {
				continue
			}
			switch {
			case ev.Type == watch.Deleted:
				// A csi-addons sidecar in the pod recreates its object at once; give it that
				// moment, then put ours back (creating the object if nobody did).
				if !r.sleep(ctx, r.backoff) {
					return
				}
				r.restore(ctx, driverName)
			default:
				if _, marker := r.current(); n.Annotations[annotations.HealerRestart] != marker || n.Annotations[annotations.Endpoint] != r.endpoint {
					r.restore(ctx, driverName)
				}
			}
		}
	}
}

// restore writes the sidecar's annotations again on the registered object, with the marker of
// the latest registration.
func (r *registrar) restore(ctx context.Context, driverName string) {
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	name, marker := r.current()
	name, _, err := r.registerAs(ctx, driverName, marker, name, nil)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot put the sidecar's annotations back on the CSIAddonsNode; trying again on its next change")
		return
	}
	klog.FromContext(ctx).V(2).Info("CSIAddonsNode carries the sidecar's annotations", "csiAddonsNode", klog.KRef(r.namespace, name), "marker", marker)
}

// sleep waits d, or returns false when ctx ends first.
func (r *registrar) sleep(ctx context.Context, d time.Duration) bool {
	t := r.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// register makes one attempt: it merge-patches the restart marker and endpoint onto the
// existing CSIAddonsNode, or creates the object, and returns its name and the resourceVersion the
// write left. Without a name given it looks the object up and also returns the CSIAddonsNodes of
// this driver and node it listed, for converge.
func (r *registrar) register(ctx context.Context, driverName, marker string) (string, string, []csiaddonsv1alpha1.CSIAddonsNode, error) {
	name := r.name
	var matches []csiaddonsv1alpha1.CSIAddonsNode
	var listed *csiaddonsv1alpha1.CSIAddonsNode
	if name == "" {
		var err error
		if matches, err = r.matching(ctx, driverName); err != nil {
			return "", "", nil, err
		}
		// The csi-addons sidecar's wins, then the oldest; with none, the default name.
		name = DefaultCSIAddonsNodeName(r.nodeName, driverName)
		if len(matches) > 0 {
			name, listed = matches[0].Name, matches[0].DeepCopy()
		}
	}
	name, rv, err := r.registerAs(ctx, driverName, marker, name, listed)
	return name, rv, matches, err
}

// registerAs merge-patches the restart marker and endpoint onto the CSIAddonsNode name, or
// creates it, and returns the resourceVersion the write left (or that the object has, when
// there was nothing to write). listed, when not nil, is the object as just listed, which spares
// reading it again.
func (r *registrar) registerAs(ctx context.Context, driverName, marker, name string, listed *csiaddonsv1alpha1.CSIAddonsNode) (string, string, error) {
	set := map[string]string{annotations.HealerRestart: marker, annotations.Endpoint: r.endpoint}
	labels := map[string]string{annotations.Registration: r.label(driverName)}

	var existing csiaddonsv1alpha1.CSIAddonsNode
	var err error
	if listed != nil {
		existing = *listed
	} else {
		err = r.client.Get(ctx, types.NamespacedName{Namespace: r.namespace, Name: name}, &existing)
	}
	switch {
	case apierrors.IsNotFound(err):
		created := &csiaddonsv1alpha1.CSIAddonsNode{
			ObjectMeta: metav1.ObjectMeta{Namespace: r.namespace, Name: name, Annotations: set, Labels: labels},
			Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{
				Name: driverName, NodeID: r.nodeName, EndPoint: r.endpoint,
			}},
		}
		if err := r.client.Create(ctx, created); err != nil {
			// AlreadyExists: a csi-addons sidecar created it meanwhile; the next attempt patches.
			return "", "", fmt.Errorf("create CSIAddonsNode %s/%s: %w", r.namespace, name, err)
		}
		return name, created.ResourceVersion, nil
	case err != nil:
		return "", "", fmt.Errorf("get CSIAddonsNode %s/%s: %w", r.namespace, name, err)
	}
	if d := existing.Spec.Driver; d.Name != driverName || d.NodeID != r.nodeName {
		return "", "", fmt.Errorf("%w: %s/%s names driver %q on node %q, this sidecar serves driver %q on node %q; fix --csiaddonsnode-name",
			ErrCSIAddonsNodeConflict, r.namespace, name, d.Name, d.NodeID, driverName, r.nodeName)
	}
	if existing.Annotations[annotations.HealerRestart] == marker && existing.Annotations[annotations.Endpoint] == r.endpoint &&
		existing.Labels[annotations.Registration] == labels[annotations.Registration] && !carriesPrevious(&existing) {
		// keep's check when its watch starts, mostly: nothing to write. A listed object may
		// trail the API server: its resourceVersion is not one to watch from.
		if listed != nil {
			return name, "", nil
		}
		return name, existing.ResourceVersion, nil
	}
	// A merge patch of two annotations and a label, which removes the keys 0.1.0 wrote them
	// under: it cannot conflict with, or undo, what the csi-addons sidecar writes, and needs no
	// resourceVersion.
	patch := annotations.LabeledMergePatch(set, labels)
	if err := r.client.Patch(ctx, &existing, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return "", "", fmt.Errorf("patch CSIAddonsNode %s/%s: %w", r.namespace, name, err)
	}
	return name, existing.ResourceVersion, nil
}

// deregisterTimeout bounds how long a stopping sidecar tries to take its endpoint off its
// CSIAddonsNode: a few API round trips, well inside the pod's termination grace period, so that
// an unreachable API server does not hold the stop.
const deregisterTimeout = 5 * time.Second

// deregister takes the sidecar's endpoint off the registered CSIAddonsNode when the sidecar stops,
// so that the controller does not sweep the next restart through a sidecar that is gone. It does
// so only while the object carries this start's endpoint and marker: a successor pod may have
// written its own already (the same endpoint too, on the host network), and that one stays. The
// write carries the resourceVersion it read, so a successor's write between the read and the
// write is not undone. The restart marker stays: the controller must still sweep it.
func (r *registrar) deregister(ctx context.Context) error {
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	name, marker := r.current()
	if name == "" {
		return nil
	}
	key := types.NamespacedName{Namespace: r.namespace, Name: name}
	// One write, when the object carries this start's endpoint and marker under their keys: the
	// API server checks them (JSON patch "test") and removes the endpoint in one step, so a
	// successor's write is never undone. Any other state is read and judged below.
	taken := &csiaddonsv1alpha1.CSIAddonsNode{ObjectMeta: metav1.ObjectMeta{Namespace: r.namespace, Name: name}}
	err := r.client.Patch(ctx, taken, client.RawPatch(types.JSONPatchType, endpointRemoval(r.endpoint, marker)))
	switch {
	case err == nil:
		klog.FromContext(ctx).Info("Took the sidecar's endpoint off the CSIAddonsNode", "csiAddonsNode", klog.KRef(r.namespace, name), "endpoint", r.endpoint)
		return nil
	case apierrors.IsNotFound(err):
		return nil
	}
	for {
		var n csiaddonsv1alpha1.CSIAddonsNode
		if err := r.client.Get(ctx, key, &n); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("get CSIAddonsNode %s: %w", key, err)
		}
		if annotations.Value(n.Annotations, annotations.Endpoint) != r.endpoint || annotations.Value(n.Annotations, annotations.HealerRestart) != marker {
			klog.FromContext(ctx).Info("CSIAddonsNode carries another start's endpoint; leaving it", "csiAddonsNode", klog.KRef(r.namespace, name),
				"endpoint", annotations.Value(n.Annotations, annotations.Endpoint), "marker", annotations.Value(n.Annotations, annotations.HealerRestart))
			return nil
		}
		without := n.DeepCopy()
		delete(without.Annotations, annotations.Endpoint)
		delete(without.Annotations, annotations.Previous(annotations.Endpoint))
		err := r.client.Patch(ctx, without, client.MergeFromWithOptions(&n, client.MergeFromWithOptimisticLock{}))
		switch {
		case err == nil:
			klog.FromContext(ctx).Info("Took the sidecar's endpoint off the CSIAddonsNode", "csiAddonsNode", klog.KRef(r.namespace, name), "endpoint", r.endpoint)
			return nil
		case apierrors.IsConflict(err):
			// Written meanwhile: read it again, it may be a successor's now.
			continue
		default:
			return fmt.Errorf("take the endpoint off CSIAddonsNode %s: %w", key, err)
		}
	}
}

// endpointRemoval is a JSON patch that removes the endpoint annotation if, and only if, the
// object carries endpoint and marker under the current keys.
func endpointRemoval(endpoint, marker string) []byte {
	path := func(key string) string {
		return "/metadata/annotations/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(key)
	}
	ops := []map[string]string{
		{"op": "test", "path": path(annotations.Endpoint), "value": endpoint},
		{"op": "test", "path": path(annotations.HealerRestart), "value": marker},
		{"op": "remove", "path": path(annotations.Endpoint)},
	}
	b, _ := json.Marshal(ops) // strings only: cannot fail
	return b
}

// carriesPrevious reports whether n carries one of the sidecar's annotations or its label under
// the key of 0.1.0, which a registration removes.
func carriesPrevious(n *csiaddonsv1alpha1.CSIAddonsNode) bool {
	for _, key := range []string{annotations.HealerRestart, annotations.Endpoint} {
		if _, ok := n.Annotations[annotations.Previous(key)]; ok {
			return true
		}
	}
	_, ok := n.Labels[annotations.Previous(annotations.Registration)]
	return ok
}

// labelled lists the CSIAddonsNodes of this driver and node that carry the sidecar's registration
// label, as matching does: one LIST per key of the label (this release's and the one of 0.1.0,
// on objects registered by that version), since one label selector cannot match either key.
func (r *registrar) labelled(ctx context.Context, driverName string) ([]csiaddonsv1alpha1.CSIAddonsNode, error) {
	var all []csiaddonsv1alpha1.CSIAddonsNode
	for _, key := range annotations.Keys(annotations.Registration) {
		matches, err := r.matching(ctx, driverName, client.MatchingLabels{key: r.label(driverName)})
		if err != nil {
			return nil, err
		}
		for _, n := range matches {
			// An object carrying both labels (the watch cache behind a patch) is listed twice.
			if !slices.ContainsFunc(all, func(m csiaddonsv1alpha1.CSIAddonsNode) bool { return m.Name == n.Name }) {
				all = append(all, n)
			}
		}
	}
	sortMatches(all)
	return all, nil
}

// label is the value of the annotations.Registration label on the objects this sidecar registers on.
func (r *registrar) label(driverName string) string {
	return annotations.RegistrationValue(driverName, r.nodeName)
}

// matching lists the CSIAddonsNodes of the namespace that name this driver and node, the one the
// sidecar registers on first: the csi-addons sidecar's, then the oldest. The custom resource
// offers no field selector on spec.driver: without a label selector in opts this is a LIST of
// every node's objects in the namespace. It is served from the API server's watch cache.
func (r *registrar) matching(ctx context.Context, driverName string, opts ...client.ListOption) ([]csiaddonsv1alpha1.CSIAddonsNode, error) {
	var list csiaddonsv1alpha1.CSIAddonsNodeList
	opts = append([]client.ListOption{client.InNamespace(r.namespace), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: "0"}}}, opts...)
	if err := r.client.List(ctx, &list, opts...); err != nil {
		return nil, fmt.Errorf("list CSIAddonsNodes in %s: %w", r.namespace, err)
	}
	var matches []csiaddonsv1alpha1.CSIAddonsNode
	for _, n := range list.Items {
		if n.Spec.Driver.Name == driverName && n.Spec.Driver.NodeID == r.nodeName && n.DeletionTimestamp == nil {
			matches = append(matches, n)
		}
	}
	sortMatches(matches)
	return matches, nil
}

// sortMatches puts the CSIAddonsNodes in the order the sidecar registers on them: the csi-addons
// sidecar's, then the oldest, then by name.
func sortMatches(matches []csiaddonsv1alpha1.CSIAddonsNode) {
	slices.SortFunc(matches, func(a, b csiaddonsv1alpha1.CSIAddonsNode) int {
		_, aOwned := a.Annotations[annotations.CSIAddonsPod]
		_, bOwned := b.Annotations[annotations.CSIAddonsPod]
		switch {
		case aOwned && !bOwned:
			return -1
		case bOwned && !aOwned:
			return 1
		}
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}

// converge takes this sidecar's endpoint off every other CSIAddonsNode of its driver and node
// (one registered before the csi-addons sidecar created its own, say), so that one object says
// where the sidecar listens. The restart marker stays on them: removing it would change their
// marker and draw a needless sweep. matches are the CSIAddonsNodes of this driver and node, as
// matching lists them.
func (r *registrar) converge(ctx context.Context, registered string, matches []csiaddonsv1alpha1.CSIAddonsNode) {
	for i := range matches {
		n := &matches[i]
		if n.Name == registered || annotations.Value(n.Annotations, annotations.Endpoint) == "" {
			continue
		}
		patch := annotations.MergePatch(nil, annotations.Endpoint)
		if err := r.client.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch)); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot take the sidecar's endpoint off a second CSIAddonsNode", "csiAddonsNode", klog.KRef(n.Namespace, n.Name))
			continue
		}
		klog.FromContext(ctx).Info("Took the sidecar's endpoint off a second CSIAddonsNode of this driver and node", "csiAddonsNode", klog.KRef(n.Namespace, n.Name), "registered", registered)
	}
}
