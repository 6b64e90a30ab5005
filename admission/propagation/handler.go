package propagation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/policy/webhook"
)

// Path is where the webhook answers, as the MutatingWebhookConfiguration names it.
const Path = "/mutate-pod-propagation"

// ReasonNotSet is the reason of the Warning Event recorded when the webhook let a pod through
// unchanged because it could not decide for it.
const ReasonNotSet = "MountPropagationNotSet"

// Defaults of the Limits a Handler applies where Options leave them zero.
const (
	// DefaultMaxReviewBytes bounds the body of a review: it carries the pod once, and the API
	// server stores objects of at most 1.5 MiB.
	DefaultMaxReviewBytes = 3 << 20
	// DefaultMaxInFlight is how many reviews are read and decided at once. A review costs a few
	// cache reads and one policy evaluation; a scale-up of thousands of pods finds most of them
	// answered within milliseconds, and the rest created unchanged (failurePolicy Ignore).
	DefaultMaxInFlight = 64
	// DefaultCheckTimeout bounds one review when the API server names no shorter timeout; the
	// MutatingWebhookConfiguration of deploy/ gives the webhook 3 seconds.
	DefaultCheckTimeout = 2 * time.Second
)

// Decider decides, per pod, which claim volumes get HostToContainer; *policy.Engine is one. It
// also says whether the serving policy has a propagation rule at all.
type Decider interface {
	DecidePropagation(ctx context.Context, in *policy.PropagationInput) (policy.PropagationDecisions, bool, error)
}

var _ Decider = (*policy.Engine)(nil)

// Options configure a Handler.
type Options struct {
	// Policy decides which volumes get HostToContainer. Required.
	Policy Decider
	// Objects reads the pod's namespace, claims, volumes and StorageClasses. Required.
	Objects Objects
	// Recorder records the Events of pods let through undecided. Default nil: no Events.
	Recorder record.EventRecorder
	// Metrics counts the requests. Default nil: no metrics.
	Metrics *Metrics
	// Limits bound the size, number and time of the reviews. Default: this package's
	// DefaultMaxReviewBytes, DefaultMaxInFlight and DefaultCheckTimeout.
	Limits webhook.Limits
}

// Handler answers admission.k8s.io/v1 AdmissionReviews of pods being created with the JSONPatch
// that sets mountPropagation HostToContainer where the policy says so. It never refuses a pod:
// what it cannot decide for it lets through unchanged.
type Handler struct {
	opts  Options
	slots chan struct{}
}

// NewHandler returns the webhook's handler.
func NewHandler(o Options) (*Handler, error) {
	if o.Policy == nil || o.Objects == nil {
		return nil, errors.New("propagation webhook: a policy and the cluster's objects are required")
	}
	if o.Limits.MaxReviewBytes <= 0 {
		o.Limits.MaxReviewBytes = DefaultMaxReviewBytes
	}
	if o.Limits.MaxInFlight <= 0 {
		o.Limits.MaxInFlight = DefaultMaxInFlight
	}
	if o.Limits.CheckTimeout <= 0 {
		o.Limits.CheckTimeout = DefaultCheckTimeout
	}
	return &Handler{opts: o, slots: make(chan struct{}, o.Limits.MaxInFlight)}, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	result := h.serve(w, r)
	h.opts.Metrics.observe(result, time.Since(start))
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request) string {
	logger := klog.FromContext(r.Context()).WithName("propagation")
	refuse := func(code int, err error) string {
		// The API server applies failurePolicy Ignore: the pod is created unchanged. A flood of
		// refusals must not become a flood of logs; the metric counts them.
		logger.V(2).Info("Refused a pod admission review; the API server creates the pod unchanged", "error", err.Error(), "code", code, "remote", r.RemoteAddr)
		http.Error(w, err.Error(), code)
		return ResultRefused
	}
	select {
	case h.slots <- struct{}{}:
		defer func() { <-h.slots }()
	default:
		return refuse(http.StatusTooManyRequests, fmt.Errorf(
			"%d pod admission reviews are being decided already, the most this replica takes at once", h.opts.Limits.MaxInFlight))
	}
	review, code, err := webhook.ReadReview(w, r, h.opts.Limits.MaxReviewBytes)
	if err != nil {
		return refuse(code, err)
	}
	timeout := h.opts.Limits.CheckTimeout
	if t, err := time.ParseDuration(r.URL.Query().Get("timeout")); err == nil && t > 0 && t < timeout {
		timeout = t
	}
	ctx, cancel := context.WithTimeout(klog.NewContext(r.Context(), logger), timeout)
	defer cancel()
	resp, result := h.review(ctx, review.Request)
	resp.UID = review.Request.UID
	body, err := json.Marshal(&admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp})
	if err != nil {
		return refuse(http.StatusInternalServerError, fmt.Errorf("encoding the AdmissionReview response: %w", err))
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
	return result
}

// podKind is the only kind the webhook changes.
var podKind = metav1.GroupVersionKind{Group: "", Version: "v1", Kind: "Pod"}

// failure is why a pod is let through undecided, and the claim the Event goes on: the claim at
// fault when there is one that exists, else (a claim not found, the namespace, the policy) none,
// and the Event goes on the pod's namespace.
type failure struct {
	claim *corev1.PersistentVolumeClaim
	err   error
}

// review decides for one request. Every answer allows the pod.
func (h *Handler) review(ctx context.Context, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, string) {
	allow := &admissionv1.AdmissionResponse{Allowed: true}
	if req.Kind != podKind || req.SubResource != "" || req.Operation != admissionv1.Create {
		// A webhook configuration that sends more than pod creations must not change anything.
		return allow, ResultUnchanged
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return h.failOpen(ctx, req.Namespace, podName(&pod, req), failure{err: fmt.Errorf("decoding the pod: %w", err)}), ResultFailedOpen
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	name := podName(&pod, req)
	logger := klog.FromContext(ctx).WithValues("pod", pod.Namespace+"/"+name)
	ctx = klog.NewContext(ctx, logger)
	volumes := policy.ClaimVolumesOf(&pod.Spec)
	if len(volumes) == 0 {
		return allow, ResultUnchanged
	}
	in, f := h.input(ctx, &pod, volumes)
	if f != nil {
		return h.failOpen(ctx, pod.Namespace, name, *f), ResultFailedOpen
	}
	decisions, defined, err := h.opts.Policy.DecidePropagation(ctx, in)
	if err != nil {
		return h.failOpen(ctx, pod.Namespace, name, failure{err: err}), ResultFailedOpen
	}
	if !defined {
		logger.V(4).Info("The policy has no propagation rule; pod unchanged", "reason", policy.PropagationNoRule)
		return allow, ResultUnchanged
	}
	set := map[string]bool{}
	var reasons []string
	for _, v := range in.Volumes {
		if d, ok := decisions[v.Name]; ok {
			set[v.Name] = d.Set
			reasons = append(reasons, fmt.Sprintf("%s=%t(%s)", v.Name, d.Set, d.Reason))
		}
	}
	ops := Patch(&pod.Spec, set)
	if len(ops) == 0 {
		logger.V(4).Info("Pod unchanged", "decisions", reasons)
		return allow, ResultUnchanged
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return h.failOpen(ctx, pod.Namespace, name, failure{err: fmt.Errorf("encoding the patch: %w", err)}), ResultFailedOpen
	}
	logger.V(2).Info("Set mountPropagation HostToContainer", "mounts", len(ops), "decisions", reasons)
	jsonPatch := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{
		Allowed: true, PatchType: &jsonPatch, Patch: patch,
		// The API server's audit log says why each volume was or was not changed.
		AuditAnnotations: map[string]string{"decisions": strings.Join(reasons, ",")},
	}, ResultPatched
}

// podName is the pod's name, or its generateName prefix followed by "*" when the API server
// has not named it yet.
func podName(pod *corev1.Pod, req *admissionv1.AdmissionRequest) string {
	switch {
	case pod.Name != "":
		return pod.Name
	case req.Name != "":
		return req.Name
	default:
		return pod.GenerateName + "*"
	}
}

// input builds the policy input of the pod from the caches.
func (h *Handler) input(ctx context.Context, pod *corev1.Pod, volumes []policy.ClaimVolume) (*policy.PropagationInput, *failure) {
	ns, err := h.opts.Objects.Namespace(ctx, pod.Namespace)
	if err != nil {
		return nil, &failure{err: err}
	}
	in := &policy.PropagationInput{
		Pod: policy.AdmittedPod{Namespace: pod.Namespace, Name: pod.Name, GenerateName: pod.GenerateName, Labels: pod.Labels},
		// The pod's own labels and the namespace's are the caller's; the policy reads them only.
		Namespace: policy.Labeled{Name: ns.Name, Labels: ns.Labels},
		Volumes:   volumes,
	}
	if ref := metav1.GetControllerOf(pod); ref != nil {
		in.Pod.OwnerKind = ref.Kind
	}
	for i := range in.Volumes {
		v := &in.Volumes[i]
		pvc, err := h.opts.Objects.Claim(ctx, pod.Namespace, v.Claim)
		if err != nil {
			return nil, &failure{err: fmt.Errorf("volume %s: %w", v.Name, err)}
		}
		class := ""
		if pvc.Spec.StorageClassName != nil {
			class = *pvc.Spec.StorageClassName
		}
		if pvc.Spec.VolumeName != "" {
			pv, err := h.opts.Objects.PersistentVolume(ctx, pvc.Spec.VolumeName)
			if err != nil {
				return nil, &failure{claim: pvc, err: fmt.Errorf("volume %s, claim %s: %w", v.Name, v.Claim, err)}
			}
			v.PersistentVolume, class = pv.Name, pv.Spec.StorageClassName
			if pv.Spec.CSI != nil {
				v.Driver = pv.Spec.CSI.Driver
			}
		}
		if class == "" {
			continue
		}
		sc, err := h.opts.Objects.StorageClass(class)
		if err != nil {
			return nil, &failure{claim: pvc, err: fmt.Errorf("volume %s, claim %s: %w", v.Name, v.Claim, err)}
		}
		v.StorageClass = &policy.ClassInfo{Name: class}
		if sc == nil {
			continue
		}
		v.StorageClass.Labels, v.StorageClass.Parameters = sc.Labels, sc.Parameters
		if v.PersistentVolume == "" {
			// Not bound yet (WaitForFirstConsumer binds after the pod is scheduled): the
			// provisioner makes the volume, a CSI volume when the provisioner is a CSI driver.
			csi, err := h.opts.Objects.CSIDriver(sc.Provisioner)
			if err != nil {
				return nil, &failure{claim: pvc, err: fmt.Errorf("volume %s, claim %s: %w", v.Name, v.Claim, err)}
			}
			if csi {
				v.Driver = sc.Provisioner
			}
		}
	}
	return in, nil
}

// failOpen lets the pod through unchanged, with a warning to its creator, a log line and a
// Warning Event: on the claim at fault when there is one, else on the pod's namespace, where
// `kubectl get events -n <namespace>` shows it beside the pod's owner's Events (a pod being
// created has no object to put it on yet).
func (h *Handler) failOpen(ctx context.Context, namespace, pod string, f failure) *admissionv1.AdmissionResponse {
	msg := fmt.Sprintf("volume-healer could not decide the mount propagation of pod %s/%s and created it unchanged: %v", namespace, pod, f.err)
	klog.FromContext(ctx).Error(f.err, "Pod created without mount propagation decision", "namespace", namespace, "podName", pod)
	if h.opts.Recorder != nil {
		var obj *corev1.ObjectReference
		if f.claim != nil {
			obj = &corev1.ObjectReference{APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: f.claim.Namespace, Name: f.claim.Name, UID: f.claim.UID}
		} else {
			obj = &corev1.ObjectReference{APIVersion: "v1", Kind: "Namespace", Name: namespace, Namespace: namespace}
		}
		h.opts.Recorder.Event(obj, corev1.EventTypeWarning, ReasonNotSet, truncate(msg, 1024))
	}
	return &admissionv1.AdmissionResponse{Allowed: true, Warnings: []string{truncate(msg, 512)}}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
