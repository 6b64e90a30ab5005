package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/policy"
)

// Path is where the webhook answers, as the ValidatingWebhookConfiguration names it.
const Path = "/validate-policy"

// maxReviewBytes bounds the body of a review: an update carries the ConfigMap twice, and the API
// server stores objects of at most 1.5 MiB (etcd's default request size).
const maxReviewBytes = 8 << 20

// Checker judges a change to a policy ConfigMap: nil when the controller would accept the policy
// set with it, an error wrapping policy.ErrRejected when it would not.
type Checker interface {
	Check(ctx context.Context, cm, old *corev1.ConfigMap) error
}

var _ Checker = (*policy.ConfigMapSource)(nil)

// configMapKind is the only kind the webhook judges.
var configMapKind = metav1.GroupVersionKind{Group: "", Version: "v1", Kind: "ConfigMap"}

// Handler answers admission.k8s.io/v1 AdmissionReviews of ConfigMaps. It denies a create or
// update that the checker refuses, with the checker's message, and allows everything else: a
// delete, another kind (a webhook configuration that sends more than it should must not block
// the cluster), a ConfigMap outside the policy set. A review it cannot judge gets an HTTP error
// status, so that the API server applies the webhook's failurePolicy.
type Handler struct {
	checker Checker
	metrics *Metrics
}

// NewHandler returns a handler that judges with checker and counts in metrics (nil: no metrics).
func NewHandler(checker Checker, metrics *Metrics) *Handler {
	return &Handler{checker: checker, metrics: metrics}
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	result := h.serve(w, r)
	h.metrics.observe(result, time.Since(start))
}

// requestError is a review the webhook cannot judge, answered with an HTTP error status.
type requestError struct {
	code int
	err  error
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request) string {
	answer, rerr := h.answer(w, r)
	var body []byte
	if rerr == nil {
		var err error
		if body, err = json.Marshal(answer); err != nil {
			rerr = &requestError{http.StatusInternalServerError, fmt.Errorf("encoding the AdmissionReview response: %w", err)}
		}
	}
	if rerr != nil {
		klog.FromContext(r.Context()).Error(rerr.err, "Cannot judge an admission review; the API server applies the webhook's failurePolicy",
			"code", rerr.code, "remote", r.RemoteAddr)
		http.Error(w, rerr.err.Error(), rerr.code)
		return ResultError
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
	if answer.Response.Allowed {
		return ResultAllowed
	}
	return ResultDenied
}

// answer reads the review in r and judges its request.
func (h *Handler) answer(w http.ResponseWriter, r *http.Request) (*admissionv1.AdmissionReview, *requestError) {
	review, rerr := readReview(w, r)
	if rerr != nil {
		return nil, rerr
	}
	ctx := r.Context()
	// The API server says how long it waits (?timeout=5s); a check past that helps no one.
	if timeout, err := time.ParseDuration(r.URL.Query().Get("timeout")); err == nil && timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	resp, rerr := h.review(ctx, review.Request)
	if rerr != nil {
		return nil, rerr
	}
	resp.UID = review.Request.UID
	return &admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}, nil
}

// readReview reads an AdmissionReview v1 with a request from the body of r.
func readReview(w http.ResponseWriter, r *http.Request) (*admissionv1.AdmissionReview, *requestError) {
	if r.Method != http.MethodPost {
		return nil, &requestError{http.StatusMethodNotAllowed, fmt.Errorf("%s %s: an AdmissionReview comes with POST", r.Method, r.URL.Path)}
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return nil, &requestError{http.StatusUnsupportedMediaType, fmt.Errorf("content type %q: an AdmissionReview comes as application/json", r.Header.Get("Content-Type"))}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxReviewBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, &requestError{http.StatusRequestEntityTooLarge, fmt.Errorf("the AdmissionReview is larger than %d bytes", maxReviewBytes)}
		}
		return nil, &requestError{http.StatusBadRequest, fmt.Errorf("reading the AdmissionReview: %w", err)}
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		return nil, &requestError{http.StatusBadRequest, fmt.Errorf("decoding the AdmissionReview: %w", err)}
	}
	if gv := admissionv1.SchemeGroupVersion.String(); review.APIVersion != gv || review.Kind != "AdmissionReview" {
		return nil, &requestError{http.StatusBadRequest, fmt.Errorf(
			"got a %s %q, want a %s AdmissionReview: list only v1 in the webhook configuration's admissionReviewVersions", review.APIVersion, review.Kind, gv)}
	}
	if review.Request == nil {
		return nil, &requestError{http.StatusBadRequest, errors.New("the AdmissionReview holds no request")}
	}
	return &review, nil
}

// review judges one request.
func (h *Handler) review(ctx context.Context, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, *requestError) {
	logger := klog.FromContext(ctx).WithValues("configMap", req.Namespace+"/"+req.Name, "operation", req.Operation, "user", req.UserInfo.Username)
	if req.Kind != configMapKind {
		logger.Info("The webhook configuration sends a kind other than ConfigMap; allowed", "kind", req.Kind.String())
		return &admissionv1.AdmissionResponse{Allowed: true, Warnings: []string{fmt.Sprintf(
			"the volume-healer policy webhook judges v1 ConfigMaps only, not %s: its ValidatingWebhookConfiguration should send ConfigMaps alone", req.Kind.String())}}, nil
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		// A delete leaves the rest of the set, which the controller judges when it loads it.
		return &admissionv1.AdmissionResponse{Allowed: true}, nil
	}
	cm, err := decodeConfigMap(req.Object.Raw, req.Namespace)
	if err != nil {
		return nil, &requestError{http.StatusBadRequest, fmt.Errorf("%s of ConfigMap %s/%s: object: %w", req.Operation, req.Namespace, req.Name, err)}
	}
	var old *corev1.ConfigMap
	if req.Operation == admissionv1.Update && len(req.OldObject.Raw) > 0 {
		if old, err = decodeConfigMap(req.OldObject.Raw, req.Namespace); err != nil {
			return nil, &requestError{http.StatusBadRequest, fmt.Errorf("%s of ConfigMap %s/%s: oldObject: %w", req.Operation, req.Namespace, req.Name, err)}
		}
	}

	err = h.checker.Check(ctx, cm, old)
	switch {
	case err == nil:
		logger.V(4).Info("Allowed a change to a ConfigMap")
		return &admissionv1.AdmissionResponse{Allowed: true}, nil
	case errors.Is(err, policy.ErrRejected):
		logger.Info("Denied a change to a policy ConfigMap that the controller would reject", "dryRun", req.DryRun != nil && *req.DryRun, "error", err.Error())
		return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{
			Status:  metav1.StatusFailure,
			Code:    http.StatusForbidden,
			Reason:  metav1.StatusReasonForbidden,
			Message: err.Error(),
		}}, nil
	case errors.Is(err, policy.ErrNotSynced):
		return nil, &requestError{http.StatusServiceUnavailable, fmt.Errorf("%s of ConfigMap %s/%s: %w", req.Operation, req.Namespace, req.Name, err)}
	default:
		return nil, &requestError{http.StatusInternalServerError, fmt.Errorf("%s of ConfigMap %s/%s: %w", req.Operation, req.Namespace, req.Name, err)}
	}
}

// decodeConfigMap decodes a ConfigMap sent in a review; its namespace defaults to the request's.
func decodeConfigMap(raw []byte, namespace string) (*corev1.ConfigMap, error) {
	if len(raw) == 0 {
		return nil, errors.New("missing")
	}
	var cm corev1.ConfigMap
	if err := json.Unmarshal(raw, &cm); err != nil {
		return nil, fmt.Errorf("not a ConfigMap: %w", err)
	}
	if cm.Namespace == "" {
		cm.Namespace = namespace
	}
	return &cm, nil
}
