package propagation

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/policy/webhook"
)

var optIn = map[string]string{annotations.MountPropagationLabel: annotations.MountPropagationHostToContainer}

// cluster is the objects of the handler tests: namespace shop (opted in or not), and claims
// bound to CSI and non-CSI volumes of StorageClasses opted in or not.
func cluster(t *testing.T, nsLabels map[string]string) *Caches {
	t.Helper()
	c := &Caches{
		Namespaces: cache.NewStore(cache.MetaNamespaceKeyFunc), Claims: cache.NewStore(cache.MetaNamespaceKeyFunc),
		Volumes: cache.NewStore(cache.MetaNamespaceKeyFunc), StorageClasses: cache.NewStore(cache.MetaNamespaceKeyFunc),
		CSIDrivers: cache.NewStore(cache.MetaNamespaceKeyFunc),
	}
	claim := func(name, pv, class string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID("uid-" + name)},
			Spec: corev1.PersistentVolumeClaimSpec{VolumeName: pv, StorageClassName: &class}}
	}
	csiPV := func(name, class string) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{StorageClassName: class,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "fuse.csi.example.com", VolumeHandle: name}}}}
	}
	for _, o := range []struct {
		store cache.Store
		obj   any
	}{
		{c.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: nsLabels}}},
		{c.StorageClasses, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "opted", Labels: optIn}, Provisioner: "fuse.csi.example.com"}},
		{c.StorageClasses, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Provisioner: "fuse.csi.example.com"}},
		{c.StorageClasses, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "nfs", Labels: optIn}, Provisioner: "example.com/nfs"}},
		{c.CSIDrivers, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "fuse.csi.example.com"}}},
		{c.Claims, claim("opted", "pv-opted", "opted")},
		{c.Volumes, csiPV("pv-opted", "opted")},
		{c.Claims, claim("plain", "pv-plain", "plain")},
		{c.Volumes, csiPV("pv-plain", "plain")},
		{c.Claims, claim("nfs", "pv-nfs", "nfs")},
		{c.Volumes, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-nfs"}, Spec: corev1.PersistentVolumeSpec{StorageClassName: "nfs",
			PersistentVolumeSource: corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs", Path: "/"}}}}},
		{c.Claims, claim("waiting", "", "opted")},
		{c.Claims, claim("orphan", "pv-gone", "opted")},
	} {
		if err := o.store.Add(o.obj); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// podWith is a pod of namespace shop whose container app mounts the given claims at /<claim>.
func podWith(claims ...string) *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", GenerateName: "web-"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app"}}}}
	for _, c := range claims {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: c, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c}}})
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, vm(c, "/"+c, nil))
	}
	return pod
}

// failingPolicy stands in for a policy whose evaluation fails.
type failingPolicy struct{}

func (failingPolicy) DecidePropagation(context.Context, *policy.PropagationInput) (policy.PropagationDecisions, bool, error) {
	return nil, false, errors.New("eval_builtin_error: divide by zero")
}

// review sends pod to h as the API server would, for operation, and returns the response.
func review(t *testing.T, h http.Handler, op admissionv1.Operation, obj runtime.Object) *admissionv1.AdmissionResponse {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	req := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "u-1", Kind: podKind, Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: "shop", Operation: op, Object: runtime.RawExtension{Raw: raw}},
	}
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, Path+"?timeout=3s", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("HTTP %d: %s", w.Code, w.Body)
	}
	var resp admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Response == nil || resp.Response.UID != "u-1" || !resp.Response.Allowed {
		t.Fatalf("response %+v: want the request's UID and the pod allowed", resp.Response)
	}
	return resp.Response
}

// TestHandler: the pods the policy names get HostToContainer on exactly those volumes; every
// other pod passes unchanged, and a pod the webhook cannot decide for passes unchanged with a
// warning, an Event and the metric.
func TestHandler(t *testing.T) {
	engine, err := policy.NewEngine(context.Background(), policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		nsLabels   map[string]string
		decider    Decider
		op         admissionv1.Operation
		obj        runtime.Object
		wantOps    []PatchOperation
		wantResult string
		// wantEvent is the start of the Event recorded, "" for none.
		wantEvent string
	}{
		"no claim volume": {obj: podWith(), wantResult: ResultUnchanged},
		"not opted in":    {obj: podWith("plain"), wantResult: ResultUnchanged},
		"StorageClass opted in, among others": {obj: podWith("plain", "opted", "nfs"), wantResult: ResultPatched,
			wantOps: []PatchOperation{{"add", "/spec/containers/0/volumeMounts/1/mountPropagation", "HostToContainer"}}},
		"namespace opted in: CSI volumes only": {nsLabels: optIn, obj: podWith("plain", "nfs"), wantResult: ResultPatched,
			wantOps: []PatchOperation{{"add", "/spec/containers/0/volumeMounts/0/mountPropagation", "HostToContainer"}}},
		"claim not bound yet, CSI provisioner": {obj: podWith("waiting"), wantResult: ResultPatched,
			wantOps: []PatchOperation{{"add", "/spec/containers/0/volumeMounts/0/mountPropagation", "HostToContainer"}}},
		"an update is none of its business": {nsLabels: optIn, op: admissionv1.Update, obj: podWith("opted"), wantResult: ResultUnchanged},
		"another kind is none of its business": {nsLabels: optIn, obj: &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}},
			wantResult: ResultUnchanged},
		"claim not found: fails open, Event on the namespace": {obj: podWith("opted", "missing"), wantResult: ResultFailedOpen,
			wantEvent: "Warning MountPropagationNotSet Namespace/shop: volume-healer could not decide the mount propagation of pod shop/web-*"},
		"PV not found: fails open, Event on the claim": {obj: podWith("orphan"), wantResult: ResultFailedOpen,
			wantEvent: "Warning MountPropagationNotSet PersistentVolumeClaim/orphan: volume-healer could not decide"},
		"policy fails: fails open": {decider: failingPolicy{}, obj: podWith("opted"), wantResult: ResultFailedOpen,
			wantEvent: "Warning MountPropagationNotSet Namespace/shop: volume-healer could not decide the mount propagation of pod shop/web-* and created it unchanged: eval_builtin_error"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			events := &refRecorder{}
			decider := tc.decider
			if decider == nil {
				decider = engine
			}
			h, err := NewHandler(Options{Policy: decider, Objects: cluster(t, tc.nsLabels), Recorder: events, Metrics: NewMetrics(reg)})
			if err != nil {
				t.Fatal(err)
			}
			op := tc.op
			if op == "" {
				op = admissionv1.Create
			}
			resp := review(t, h, op, tc.obj)
			var ops []PatchOperation
			if len(resp.Patch) > 0 {
				if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
					t.Errorf("patch type %v, want JSONPatch", resp.PatchType)
				}
				if err := json.Unmarshal(resp.Patch, &ops); err != nil {
					t.Fatal(err)
				}
			}
			if len(ops) != len(tc.wantOps) || (len(ops) > 0 && !equalOps(ops, tc.wantOps)) {
				t.Errorf("patch %+v, want %+v", ops, tc.wantOps)
			}
			for _, r := range []string{ResultPatched, ResultUnchanged, ResultFailedOpen, ResultRefused} {
				want := 0.0
				if r == tc.wantResult {
					want = 1
				}
				if got := requests(t, reg, r); got != want {
					t.Errorf("volume_healer_propagation_webhook_requests_total{result=%q} = %v, want %v", r, got, want)
				}
			}
			switch {
			case tc.wantEvent == "" && len(events.events) > 0:
				t.Errorf("Events %q, want none", events.events)
			case tc.wantEvent != "" && (len(events.events) != 1 || !strings.HasPrefix(events.events[0], tc.wantEvent)):
				t.Errorf("Events %q, want one starting %q", events.events, tc.wantEvent)
			case tc.wantEvent != "" && len(resp.Warnings) != 1:
				t.Errorf("warnings %q, want one for the pod's creator", resp.Warnings)
			}
		})
	}
}

func equalOps(a, b []PatchOperation) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// requests reads volume_healer_propagation_webhook_requests_total{result} from reg.
func requests(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "volume_healer_propagation_webhook_requests_total" {
			continue
		}
		for _, m := range mf.Metric {
			if m.Label[0].GetName() == "result" && m.Label[0].GetValue() == result {
				return m.Counter.GetValue()
			}
		}
	}
	t.Fatalf("volume_healer_propagation_webhook_requests_total{result=%q} is not exposed", result)
	return 0
}

// refRecorder records Events as "type reason Kind/name: message".
type refRecorder struct{ events []string }

var _ record.EventRecorder = (*refRecorder)(nil)

func (r *refRecorder) Event(obj runtime.Object, eventtype, reason, message string) {
	ref := obj.(*corev1.ObjectReference)
	r.events = append(r.events, eventtype+" "+reason+" "+ref.Kind+"/"+ref.Name+": "+message)
}

func (r *refRecorder) Eventf(obj runtime.Object, eventtype, reason, format string, args ...any) {
	panic("not used")
}

func (r *refRecorder) AnnotatedEventf(obj runtime.Object, _ map[string]string, eventtype, reason, format string, args ...any) {
	panic("not used")
}

// TestHandlerRefusesWhatItCannotRead: a review it cannot read gets an HTTP error, so that the API
// server applies failurePolicy Ignore and creates the pod unchanged; it is counted.
func TestHandlerRefusesWhatItCannotRead(t *testing.T) {
	reg := prometheus.NewRegistry()
	h, err := NewHandler(Options{Policy: failingPolicy{}, Objects: cluster(t, nil), Metrics: NewMetrics(reg),
		Limits: webhook.Limits{MaxReviewBytes: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"not JSON": "{", "too large": `{"x":"` + strings.Repeat("a", 2048) + `"}`} {
		r := httptest.NewRequest(http.MethodPost, Path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code < 400 {
			t.Errorf("%s: HTTP %d, want an error status", name, w.Code)
		}
	}
	if got := requests(t, reg, ResultRefused); got != 2 {
		t.Errorf("refused = %v, want 2", got)
	}
}
