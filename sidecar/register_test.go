package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

func TestDefaultCSIAddonsNodeName(t *testing.T) {
	long := strings.Repeat("n", 200)
	tests := map[string]struct {
		node, driver string
		want         string
	}{
		"dots become dashes":      {node: "worker-1", driver: "rbd.csi.ceph.com", want: "worker-1-rbd-csi-ceph-com"},
		"upper case is lowered":   {node: "Worker_1", driver: "Example.COM", want: "worker-1-example-com"},
		"long names get a suffix": {node: long, driver: long + ".example.com"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := DefaultCSIAddonsNodeName(tc.node, tc.driver)
			if tc.want != "" && got != tc.want {
				t.Errorf("name = %q, want %q", got, tc.want)
			}
			if len(got) > 253 || strings.ContainsAny(got, "._") || strings.HasSuffix(got, "-") {
				t.Errorf("name %q (%d characters) is not a valid object name", got, len(got))
			}
			if other := DefaultCSIAddonsNodeName(tc.node, tc.driver+"x"); other == got {
				t.Errorf("two drivers on one node got the same name %q", got)
			}
		})
	}
}

func newRegistrar(t *testing.T, c client.Client, name string) *registrar {
	t.Helper()
	return &registrar{
		client: c, namespace: "csi", name: name, nodeName: "node-a", podUID: "pod-2",
		endpoint: "10.0.0.7:9070", clock: clock.RealClock{}, backoff: time.Millisecond, maxBackoff: 5 * time.Millisecond,
	}
}

// followedWatcher tells on following when the registrar first reads the events of a watch it
// started: by then it has handled the state the watch began from.
type followedWatcher struct {
	client.WithWatch
	following chan<- struct{}
}

func (f followedWatcher) Watch(ctx context.Context, list client.ObjectList, opts ...client.ListOption) (watch.Interface, error) {
	w, err := f.WithWatch.Watch(ctx, list, opts...)
	if err != nil {
		return nil, err
	}
	return &followedWatch{Interface: w, following: f.following}, nil
}

type followedWatch struct {
	watch.Interface
	once      sync.Once
	following chan<- struct{}
}

func (w *followedWatch) ResultChan() <-chan watch.Event {
	w.once.Do(func() {
		select {
		case w.following <- struct{}{}:
		default:
		}
	})
	return w.Interface.ResultChan()
}

func csiAddonsNode(name, driver, node string, annotations map[string]string) *csiaddonsv1alpha1.CSIAddonsNode {
	return &csiaddonsv1alpha1.CSIAddonsNode{
		ObjectMeta: metav1.ObjectMeta{Namespace: "csi", Name: name, Annotations: annotations},
		Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{
			Name: driver, NodeID: node, EndPoint: "pod://plugin.csi:9070",
		}},
	}
}

func fakeClient(t *testing.T, funcs *interceptor.Funcs, objs ...client.Object) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := csiaddonsv1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...)
	if funcs != nil {
		b = b.WithInterceptorFuncs(*funcs)
	}
	return b.Build()
}

func TestRegister(t *testing.T) {
	csiAddonsAnnotations := map[string]string{
		annotations.CSIAddonsPod:                       "pod-1",
		"sidecar.csiaddons.openshift.io/lastUpdatedAt": "2026-01-01T00:00:00Z",
	}
	tests := map[string]struct {
		objs     []client.Object
		name     string // --csiaddonsnode-name
		wantName string
		wantErr  error
	}{
		"no CSIAddonsNode: created under the default name": {
			wantName: "node-a-rbd-csi-ceph-com",
		},
		"the csi-addons sidecar's object is found by its spec": {
			objs: []client.Object{
				csiAddonsNode("node-a-csi-daemonset-csi-rbdplugin", "rbd.csi.ceph.com", "node-a", csiAddonsAnnotations),
				csiAddonsNode("node-a-cephfs", "cephfs.csi.ceph.com", "node-a", nil),
				csiAddonsNode("node-b-rbd", "rbd.csi.ceph.com", "node-b", nil),
			},
			wantName: "node-a-csi-daemonset-csi-rbdplugin",
		},
		"of two matches the csi-addons sidecar's wins": {
			objs: []client.Object{
				csiAddonsNode("a-ours", "rbd.csi.ceph.com", "node-a", nil),
				csiAddonsNode("z-theirs", "rbd.csi.ceph.com", "node-a", csiAddonsAnnotations),
			},
			wantName: "z-theirs",
		},
		"a name given is used as is": {
			name:     "custom",
			wantName: "custom",
		},
		"a name given that belongs to another driver is left alone": {
			objs:    []client.Object{csiAddonsNode("custom", "cephfs.csi.ceph.com", "node-a", csiAddonsAnnotations)},
			name:    "custom",
			wantErr: ErrCSIAddonsNodeConflict,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := fakeClient(t, nil, tc.objs...)
			r := newRegistrar(t, c, tc.name)
			got, _, _, err := r.register(context.Background(), "rbd.csi.ceph.com", "marker-2")
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("register: %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if got != tc.wantName {
				t.Errorf("registered %q, want %q", got, tc.wantName)
			}
			var n csiaddonsv1alpha1.CSIAddonsNode
			if err := c.Get(context.Background(), client.ObjectKey{Namespace: "csi", Name: got}, &n); err != nil {
				t.Fatal(err)
			}
			if n.Annotations[annotations.HealerRestart] != "marker-2" || n.Annotations[annotations.Endpoint] != "10.0.0.7:9070" {
				t.Errorf("annotations = %v, want the marker and the endpoint", n.Annotations)
			}
			if n.Spec.Driver.Name != "rbd.csi.ceph.com" || n.Spec.Driver.NodeID != "node-a" {
				t.Errorf("spec.driver = %+v", n.Spec.Driver)
			}
			if want := annotations.RegistrationValue("rbd.csi.ceph.com", "node-a"); n.Labels[annotations.Registration] != want {
				t.Errorf("labels = %v, want %s=%s", n.Labels, annotations.Registration, want)
			}
			for _, o := range tc.objs {
				if o.GetName() != got {
					continue
				}
				if n.Spec.Driver.EndPoint != "pod://plugin.csi:9070" {
					t.Errorf("the existing object's endpoint changed to %q", n.Spec.Driver.EndPoint)
				}
				for k, v := range o.GetAnnotations() {
					if n.Annotations[k] != v {
						t.Errorf("annotation %s = %q, want %q kept", k, n.Annotations[k], v)
					}
				}
			}
		})
	}
}

// TestRegisterRetries keeps trying while the API server fails, and keeps one marker across
// the attempts.
func TestRegisterRetries(t *testing.T) {
	var fails atomic.Int32
	fails.Store(3)
	funcs := &interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if fails.Add(-1) >= 0 {
			return apierrors.NewServiceUnavailable("etcd is down")
		}
		return c.Get(ctx, key, obj, opts...)
	}}
	c := fakeClient(t, funcs)
	r := newRegistrar(t, c, "custom")
	r.clock = testingclock.NewFakeClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	fc := r.clock.(*testingclock.FakeClock)
	done := make(chan error, 1)
	go func() {
		_, err := r.run(context.Background(), "rbd.csi.ceph.com")
		done <- err
	}()
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			var n csiaddonsv1alpha1.CSIAddonsNode
			if err := c.Get(context.Background(), client.ObjectKey{Namespace: "csi", Name: "custom"}, &n); err != nil {
				t.Fatal(err)
			}
			if want := "2026-03-01T00:00:00Z/pod-2"; n.Annotations[annotations.HealerRestart] != want {
				t.Errorf("marker = %q, want %q (chosen at the first attempt)", n.Annotations[annotations.HealerRestart], want)
			}
			return
		case <-time.After(time.Millisecond):
			if fc.HasWaiters() {
				fc.Step(10 * time.Millisecond)
			}
		}
	}
}

func TestRegisterStopsWithContext(t *testing.T) {
	funcs := &interceptor.Funcs{List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
		return apierrors.NewForbidden(schema.GroupResource{Group: "csiaddons.openshift.io", Resource: "csiaddonsnodes"}, "", errors.New("no RBAC"))
	}}
	r := newRegistrar(t, fakeClient(t, funcs), "")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := r.run(ctx, "rbd.csi.ceph.com"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("run: %v, want the context's error", err)
	}
}

// The sidecar keeps its annotations on its CSIAddonsNode while it runs: the csi-addons sidecar
// recreates a deleted object without them, and someone may strip them; either way they come
// back with this start's marker, without a new restart of the sidecar.
func TestRegistrationIsKept(t *testing.T) {
	var patches atomic.Int32
	c := fakeClient(t, &interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
		patches.Add(1)
		return c.Patch(ctx, obj, patch, opts...)
	}}, csiAddonsNode("node-a-rbd", "rbd.csi.ceph.com", "node-a", map[string]string{annotations.CSIAddonsPod: "pod-1"}))
	r := newRegistrar(t, c, "")
	following := make(chan struct{}, 1)
	r.watcher = followedWatcher{WithWatch: c.(client.WithWatch), following: following}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	name, err := r.run(ctx, "rbd.csi.ceph.com")
	if err != nil {
		t.Fatal(err)
	}
	_, marker := r.current()
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		r.keep(ctx, "rbd.csi.ceph.com")
	}()
	// keep first checks the annotations (the object may have changed while nothing watched),
	// then follows its watch; the changes below come after that check.
	select {
	case <-following:
	case <-time.After(10 * time.Second):
		t.Fatal("the registrar does not watch its CSIAddonsNode")
	}
	if n := patches.Load(); n != 1 {
		t.Errorf("%d patches of the CSIAddonsNode by the time keep follows it, want 1 (keep finds the annotations in place)", n)
	}
	carries := func(what string) {
		t.Helper()
		poll.Eventually(t, 10*time.Second, what+": the CSIAddonsNode to carry the sidecar's annotations again", func() (bool, string) {
			var n csiaddonsv1alpha1.CSIAddonsNode
			err := c.Get(ctx, client.ObjectKey{Namespace: "csi", Name: name}, &n)
			return err == nil && n.Annotations[annotations.HealerRestart] == marker && n.Annotations[annotations.Endpoint] == "10.0.0.7:9070",
				fmt.Sprintf("%v, %v", n.Annotations, err)
		})
	}

	// Recreated by the csi-addons sidecar, without the healer's annotations.
	if err := c.Delete(ctx, csiAddonsNode(name, "rbd.csi.ceph.com", "node-a", nil)); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, csiAddonsNode(name, "rbd.csi.ceph.com", "node-a", map[string]string{annotations.CSIAddonsPod: "pod-1"})); err != nil {
		t.Fatal(err)
	}
	carries("recreated without them")

	// Stripped by hand.
	var n csiaddonsv1alpha1.CSIAddonsNode
	if err := c.Get(ctx, client.ObjectKey{Namespace: "csi", Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	delete(n.Annotations, annotations.Endpoint)
	if err := c.Update(ctx, &n); err != nil {
		t.Fatal(err)
	}
	carries("stripped")

	// Deleted and not recreated by anyone: the sidecar creates it again.
	if err := c.Delete(ctx, &n); err != nil {
		t.Fatal(err)
	}
	carries("deleted")

	cancel()
	select {
	case <-kept:
	case <-time.After(5 * time.Second):
		t.Fatal("keep did not return after its context ended")
	}
}

// Two objects name this driver and node (the sidecar registered before the csi-addons sidecar
// created its own): the sidecar registers on the csi-addons sidecar's and takes its endpoint off
// the other, so that one object says where it listens; the other's marker is left alone.
func TestRegisterConvergesOnOneObject(t *testing.T) {
	stale := csiAddonsNode("node-a-rbd-csi-ceph-com", "rbd.csi.ceph.com", "node-a",
		map[string]string{annotations.Endpoint: "10.0.0.3:9072", annotations.HealerRestart: "marker-1"})
	theirs := csiAddonsNode("node-a-csiaddons", "rbd.csi.ceph.com", "node-a", map[string]string{annotations.CSIAddonsPod: "pod-1"})
	other := csiAddonsNode("node-b-rbd", "rbd.csi.ceph.com", "node-b", map[string]string{annotations.Endpoint: "10.0.0.9:9072"})
	var lists atomic.Int32
	c := fakeClient(t, &interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
		lists.Add(1)
		return c.List(ctx, l, opts...)
	}}, stale, theirs, other)
	r := newRegistrar(t, c, "")
	name, err := r.run(context.Background(), "rbd.csi.ceph.com")
	if err != nil || name != "node-a-csiaddons" {
		t.Fatalf("registered %q, %v; want the csi-addons sidecar's object", name, err)
	}
	// Every node plugin start lists the namespace's CSIAddonsNodes, all nodes' objects: once.
	if n := lists.Load(); n != 1 {
		t.Errorf("the registration listed the CSIAddonsNodes %d times, want 1", n)
	}
	get := func(name string) map[string]string {
		var n csiaddonsv1alpha1.CSIAddonsNode
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "csi", Name: name}, &n); err != nil {
			t.Fatal(err)
		}
		return n.Annotations
	}
	if a := get("node-a-csiaddons"); a[annotations.Endpoint] != "10.0.0.7:9070" {
		t.Errorf("registered object's annotations %v, want the endpoint", a)
	}
	if a := get("node-a-rbd-csi-ceph-com"); a[annotations.Endpoint] != "" || a[annotations.HealerRestart] != "marker-1" {
		t.Errorf("second object's annotations %v, want the endpoint gone and the marker kept", a)
	}
	if a := get("node-b-rbd"); a[annotations.Endpoint] != "10.0.0.9:9072" {
		t.Errorf("another node's object changed: %v", a)
	}
}

// With --csiaddonsnode-name, a start lists no other node's CSIAddonsNodes: the objects this
// sidecar wrote its endpoint on before carry its label, and a label selector finds them, so that
// it still takes its endpoint off them. Objects of other nodes, labelled or not, are not listed.
// The label may be the one of 0.1.0, on an object that version registered: there is one LIST per
// key of the label.
func TestNamedRegistrationListsItsOwnObjectsOnly(t *testing.T) {
	previous := annotations.Previous
	tests := map[string]struct{ label, endpoint, marker string }{
		"registered by this release": {annotations.Registration, annotations.Endpoint, annotations.HealerRestart},
		"registered by 0.1.0":        {previous(annotations.Registration), previous(annotations.Endpoint), previous(annotations.HealerRestart)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			earlier := csiAddonsNode("node-a-rbd-csi-ceph-com", "rbd.csi.ceph.com", "node-a",
				map[string]string{tc.endpoint: "10.0.0.3:9072", tc.marker: "marker-1"})
			earlier.Labels = map[string]string{tc.label: annotations.RegistrationValue("rbd.csi.ceph.com", "node-a")}
			other := csiAddonsNode("node-b-rbd", "rbd.csi.ceph.com", "node-b", map[string]string{tc.endpoint: "10.0.0.9:9072"})
			other.Labels = map[string]string{tc.label: annotations.RegistrationValue("rbd.csi.ceph.com", "node-b")}
			objs := []client.Object{earlier, other}
			for i := range 20 {
				objs = append(objs, csiAddonsNode(fmt.Sprintf("node-%d-rbd", i), "rbd.csi.ceph.com", fmt.Sprintf("node-%d", i), nil))
			}
			var listed atomic.Int32
			var unselected atomic.Int32
			c := fakeClient(t, &interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
				listed.Add(1)
				o := (&client.ListOptions{}).ApplyOptions(opts)
				if o.LabelSelector == nil || o.LabelSelector.Empty() {
					unselected.Add(1)
				}
				return c.List(ctx, l, opts...)
			}}, objs...)
			r := newRegistrar(t, c, "custom")
			name, err := r.run(context.Background(), "rbd.csi.ceph.com")
			if err != nil || name != "custom" {
				t.Fatalf("registered %q, %v; want custom", name, err)
			}
			if listed.Load() != 2 || unselected.Load() != 0 {
				t.Errorf("%d LISTs of CSIAddonsNodes, %d without a label selector; want 2 with one", listed.Load(), unselected.Load())
			}
			get := func(name string) *csiaddonsv1alpha1.CSIAddonsNode {
				var n csiaddonsv1alpha1.CSIAddonsNode
				if err := c.Get(context.Background(), client.ObjectKey{Namespace: "csi", Name: name}, &n); err != nil {
					t.Fatal(err)
				}
				return &n
			}
			want := annotations.RegistrationValue("rbd.csi.ceph.com", "node-a")
			if n := get("custom"); n.Labels[annotations.Registration] != want || n.Annotations[annotations.Endpoint] != "10.0.0.7:9070" {
				t.Errorf("registered object: labels %v, annotations %v; want the sidecar's label and endpoint", n.Labels, n.Annotations)
			}
			if a := get("node-a-rbd-csi-ceph-com").Annotations; annotations.Value(a, annotations.Endpoint) != "" || a[tc.marker] != "marker-1" {
				t.Errorf("earlier object's annotations %v, want the endpoint gone and the marker kept", a)
			}
			if a := get("node-b-rbd").Annotations; a[tc.endpoint] != "10.0.0.9:9072" {
				t.Errorf("another node's object changed: %v", a)
			}
		})
	}
}

// A CSIAddonsNode registered by 0.1.0 (its annotations and label under
// healer.csiaddons.openshift.io) is registered again under the new keys, and the old ones go.
func TestRegistrationReplacesTheKeysOfAPreviousRelease(t *testing.T) {
	previous := annotations.Previous
	n := csiAddonsNode("custom", "rbd.csi.ceph.com", "node-a", map[string]string{
		previous(annotations.Endpoint): "10.0.0.3:9072", previous(annotations.HealerRestart): "marker-1", annotations.CSIAddonsPod: "pod-1"})
	n.Labels = map[string]string{previous(annotations.Registration): annotations.RegistrationValue("rbd.csi.ceph.com", "node-a")}
	c := fakeClient(t, nil, n)
	r := newRegistrar(t, c, "custom")
	if _, err := r.run(context.Background(), "rbd.csi.ceph.com"); err != nil {
		t.Fatal(err)
	}
	var got csiaddonsv1alpha1.CSIAddonsNode
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "csi", Name: "custom"}, &got); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{annotations.Endpoint, annotations.HealerRestart} {
		if v, ok := got.Annotations[previous(key)]; ok {
			t.Errorf("annotation %s = %q left behind", previous(key), v)
		}
	}
	if v, ok := got.Labels[previous(annotations.Registration)]; ok {
		t.Errorf("label %s = %q left behind", previous(annotations.Registration), v)
	}
	if got.Annotations[annotations.Endpoint] != "10.0.0.7:9070" || got.Annotations[annotations.HealerRestart] == "" ||
		got.Labels[annotations.Registration] != annotations.RegistrationValue("rbd.csi.ceph.com", "node-a") ||
		got.Annotations[annotations.CSIAddonsPod] != "pod-1" {
		t.Errorf("annotations %v, labels %v; want the endpoint, a marker and the label under the new keys, the csi-addons sidecar's kept", got.Annotations, got.Labels)
	}
}

// A driver restart under the running sidecar writes a new marker while keep watches the object.
// keep sees the new marker arrive before the registration that wrote it is done (converge still
// lists the other objects): it must not take the new marker for someone else's change and put
// the previous one back. The previous marker is the one the controller has recorded as handled,
// so the object would say that the driver restart was swept, and its volumes would never be.
func TestRegistrationIsKeptAcrossADriverRestart(t *testing.T) {
	const name = "node-a-rbd"
	var (
		mu       sync.Mutex
		written  []string // the markers patched onto the object, in order
		gated    atomic.Bool
		restored = make(chan struct{}, 1)
	)
	markerOf := func(patch client.Patch, obj client.Object) string {
		data, err := patch.Data(obj)
		if err != nil {
			t.Errorf("patch data: %v", err)
			return ""
		}
		var body struct {
			Metadata struct {
				Annotations map[string]*string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(data, &body); err != nil {
			t.Errorf("patch %s: %v", data, err)
			return ""
		}
		if v := body.Metadata.Annotations[annotations.HealerRestart]; v != nil {
			return *v
		}
		return ""
	}
	var first string
	funcs := &interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			marker := markerOf(patch, obj)
			if err := c.Patch(ctx, obj, patch, opts...); err != nil {
				return err
			}
			if obj.GetName() == name && marker != "" {
				mu.Lock()
				written = append(written, marker)
				mu.Unlock()
				if gated.Load() && marker == first {
					select {
					case restored <- struct{}{}:
					default:
					}
				}
			}
			return nil
		},
		// The second registration's converge lists the objects of the driver and node after it
		// has written its marker: hold it until keep has had the time to act on that write.
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if gated.Load() {
				select {
				case <-restored:
				case <-time.After(time.Second):
				}
			}
			return c.List(ctx, list, opts...)
		},
	}
	c := fakeClient(t, funcs, csiAddonsNode(name, "rbd.csi.ceph.com", "node-a", map[string]string{annotations.CSIAddonsPod: "pod-1"}))
	r := newRegistrar(t, c, name)
	r.watcher = c.(client.WithWatch)
	now := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	fc := testingclock.NewFakeClock(now)
	r.clock = fc
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := r.run(ctx, "rbd.csi.ceph.com"); err != nil {
		t.Fatal(err)
	}
	_, first = r.current()
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		r.keep(ctx, "rbd.csi.ceph.com")
	}()
	defer func() {
		cancel()
		<-kept
	}()
	// keep is watching once its first restore (no change: the object carries the annotations)
	// has read the object; give its watch a moment to start.
	time.Sleep(100 * time.Millisecond)

	// The driver restarts: the sidecar registers again, with a new marker.
	fc.Step(time.Second)
	gated.Store(true)
	if _, err := r.run(ctx, "rbd.csi.ceph.com"); err != nil {
		t.Fatal(err)
	}
	gated.Store(false)
	_, second := r.current()
	if second == first {
		t.Fatalf("the second registration kept the marker %q", first)
	}

	poll.Eventually(t, 5*time.Second, fmt.Sprintf("the new marker %q on the CSIAddonsNode after the driver restart", second), func() (bool, string) {
		var n csiaddonsv1alpha1.CSIAddonsNode
		if err := c.Get(ctx, client.ObjectKey{Namespace: "csi", Name: name}, &n); err != nil {
			t.Fatal(err)
		}
		return n.Annotations[annotations.HealerRestart] == second, fmt.Sprintf("marker %q", n.Annotations[annotations.HealerRestart])
	})
	// Let keep act on any change still in its watch before reading what was written.
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for i, m := range written {
		if m == second && slices.Contains(written[i+1:], first) {
			t.Errorf("markers written on the CSIAddonsNode: %q: the marker before the driver restart (%q) was put back after the new one (%q)", written, first, second)
			break
		}
	}
}

// The csi-addons sidecar reads its object and updates it once at its start, and a write between
// the two makes it try again only minutes later. With CSIAddonsSidecarWait the sidecar writes
// nothing until that sidecar of the same pod has written, whether the object is new or left by
// the previous pod; without any write of it, it registers once the wait is over.
func TestRegistrationWaitsForTheCSIAddonsSidecar(t *testing.T) {
	const name, driver = "node-a-csi-daemonset-plugin", "rbd.csi.ceph.com"
	ofPod := func(uid string) map[string]string { return map[string]string{annotations.CSIAddonsPod: uid} }
	tests := map[string]struct {
		objs []client.Object
		// csiAddons is what the csi-addons sidecar of pod-2 does, nil for nothing.
		csiAddons func(ctx context.Context, c client.Client) error
	}{
		"no object yet: the csi-addons sidecar creates it": {
			csiAddons: func(ctx context.Context, c client.Client) error {
				return c.Create(ctx, csiAddonsNode(name, driver, "node-a", ofPod("pod-2")))
			},
		},
		"the previous pod's object: the csi-addons sidecar updates it": {
			objs: []client.Object{csiAddonsNode(name, driver, "node-a", ofPod("pod-1"))},
			csiAddons: func(ctx context.Context, c client.Client) error {
				var n csiaddonsv1alpha1.CSIAddonsNode
				if err := c.Get(ctx, client.ObjectKey{Namespace: "csi", Name: name}, &n); err != nil {
					return err
				}
				n.Annotations = ofPod("pod-2")
				return c.Update(ctx, &n)
			},
		},
		"no csi-addons sidecar writes: registered after the wait": {
			objs: []client.Object{csiAddonsNode(name, driver, "node-a", ofPod("pod-1"))},
		},
	}
	for tname, tc := range tests {
		t.Run(tname, func(t *testing.T) {
			c := fakeClient(t, nil, tc.objs...)
			r := newRegistrar(t, c, name)
			r.watcher = c.(client.WithWatch)
			r.csiAddonsWait = time.Second
			if tc.csiAddons != nil {
				r.csiAddonsWait = time.Minute
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			began := time.Now()
			registered := make(chan error, 1)
			go func() {
				_, err := r.run(ctx, driver)
				registered <- err
			}()

			// Meanwhile the object carries no write of the sidecar.
			time.Sleep(300 * time.Millisecond)
			var n csiaddonsv1alpha1.CSIAddonsNode
			err := c.Get(ctx, client.ObjectKey{Namespace: "csi", Name: name}, &n)
			if err == nil && n.Annotations[annotations.HealerRestart] != "" {
				t.Fatalf("the sidecar wrote %v on the object before the csi-addons sidecar of its pod did", n.Annotations)
			}
			if len(tc.objs) == 0 && !apierrors.IsNotFound(err) {
				t.Fatalf("the object exists before the csi-addons sidecar made it: %v, %v", n.Annotations, err)
			}

			if tc.csiAddons != nil {
				if err := tc.csiAddons(ctx, c); err != nil {
					t.Fatalf("the csi-addons sidecar's write failed: %v", err)
				}
			}
			select {
			case err := <-registered:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the sidecar did not register within 10s")
			}
			if tc.csiAddons == nil && time.Since(began) < time.Second {
				t.Errorf("registered after %s without a write of the csi-addons sidecar, want after the 1s wait", time.Since(began))
			}
			if err := c.Get(ctx, client.ObjectKey{Namespace: "csi", Name: name}, &n); err != nil {
				t.Fatal(err)
			}
			_, marker := r.current()
			want := "pod-2"
			if tc.csiAddons == nil {
				want = "pod-1"
			}
			if n.Annotations[annotations.HealerRestart] != marker || n.Annotations[annotations.CSIAddonsPod] != want {
				t.Errorf("the object carries %v, want the sidecar's marker %s beside createdByPodUID %s", n.Annotations, marker, want)
			}
		})
	}
}
