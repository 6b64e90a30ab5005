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

// Defaults of Limits.
const (
	// DefaultMaxReviewBytes bounds the body of a review: an update carries the ConfigMap twice,
	// and the API server stores objects of at most 1.5 MiB (etcd's default request size).
	DefaultMaxReviewBytes = 8 << 20
	// DefaultMaxInFlight is how many reviews are read and judged at once: a policy change is a
	// rare, human act, and each review in flight may hold its body three times (read, decoded,
	// compiled).
	DefaultMaxInFlight = 4
	// DefaultCheckTimeout bounds one review's judgement when the API server names no shorter
	// timeout; the API server waits for a webhook at most 30 seconds.
	DefaultCheckTimeout = 10 * time.Second
)

// Limits bound what reviews can cost, whoever sends them.
type Limits struct {
	// MaxReviewBytes is the largest review body read. A larger one is refused (413) unread when
	// its Content-Length says so, else as soon as its bytes pass the bound. Default
	// DefaultMaxReviewBytes.
	MaxReviewBytes int64
	// MaxInFlight is how many reviews are read and judged at once; another one is refused at once
	// (429), and the API server applies the webhook's failurePolicy. Default DefaultMaxInFlight.
	MaxInFlight int
	// CheckTimeout bounds the judgement of one review, or the API server's ?timeout= when
	// shorter; the judgement is cancelled too when the request ends. Default DefaultCheckTimeout.
	CheckTimeout time.Duration
}

func (l *Limits) defaults() {
	if l.MaxReviewBytes <= 0 {
		l.MaxReviewBytes = DefaultMaxReviewBytes
	}
	if l.MaxInFlight <= 0 {
		l.MaxInFlight = DefaultMaxInFlight
	}
	if l.CheckTimeout <= 0 {
		l.CheckTimeout = DefaultCheckTimeout
	}
}

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
	limits  Limits
	// slots holds one token per review being read or judged.
	slots chan struct{}
}

// NewHandler returns a handler that judges with checker within limits (zero fields: the
// defaults) and counts in metrics (nil: no metrics).
func NewHandler(checker Checker, metrics *Metrics, limits Limits) *Handler {
	limits.defaults()
	return &Handler{checker: checker, metrics: metrics, limits: limits, slots: make(chan struct{}, limits.MaxInFlight)}
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
		logger := klog.FromContext(r.Context())
		if rerr.code == http.StatusTooManyRequests {
			// A flood of reviews must not become a flood of logs; the metric counts them.
			logger.V(2).Info("Refused an admission review; the API server applies the webhook's failurePolicy",
				"error", rerr.err.Error(), "code", rerr.code, "remote", r.RemoteAddr)
		} else {
			logger.Error(rerr.err, "Cannot judge an admission review; the API server applies the webhook's failurePolicy",
				"code", rerr.code, "remote", r.RemoteAddr)
		}
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

// answer reads the review in r and judges its request, if a slot is free: a review that would
// pass Limits.MaxInFlight is refused before its body is read.
func (h *Handler) answer(w http.ResponseWriter, r *http.Request) (*admissionv1.AdmissionReview, *requestError) {
	select {
	case h.slots <- struct{}{}:
		defer func() { <-h.slots }()
	default:
		return nil, &requestError{http.StatusTooManyRequests, fmt.Errorf(
			"%d admission reviews are being judged already, the most this replica takes at once; the API server applies the webhook's failurePolicy to this one", h.limits.MaxInFlight)}
	}
	review, rerr := readReview(w, r, h.limits.MaxReviewBytes)
	if rerr != nil {
		return nil, rerr
	}
	// The judgement ends when the request does, at CheckTimeout at the latest, sooner when the
	// API server says it waits less (?timeout=5s): a check past that helps no one.
	timeout := h.limits.CheckTimeout
	if t, err := time.ParseDuration(r.URL.Query().Get("timeout")); err == nil && t > 0 && t < timeout {
		timeout = t
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	resp, rerr := h.review(ctx, review.Request)
	if rerr != nil {
		return nil, rerr
	}
	resp.UID = review.Request.UID
	return &admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}, nil
}

// ReadReview reads an AdmissionReview v1 with a request from the body of r, of at most limit
// bytes, for the admission webhooks this package's Server serves. When it cannot, it returns the
// HTTP status to answer with (405, 413, 415, 400) and why.
func ReadReview(w http.ResponseWriter, r *http.Request, limit int64) (*admissionv1.AdmissionReview, int, error) {
	review, rerr := readReview(w, r, limit)
	if rerr != nil {
		return nil, rerr.code, rerr.err
	}
	return review, 0, nil
}

// readReview reads an AdmissionReview v1 with a request from the body of r, of at most limit
// bytes.
func readReview(w http.ResponseWriter, r *http.Request, limit int64) (*admissionv1.AdmissionReview, *requestError) {
	if r.Method != http.MethodPost {
		return nil, &requestError{http.StatusMethodNotAllowed, fmt.Errorf("%s %s: an AdmissionReview comes with POST", r.Method, r.URL.Path)}
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return nil, &requestError{http.StatusUnsupportedMediaType, fmt.Errorf("content type %q: an AdmissionReview comes as application/json", r.Header.Get("Content-Type"))}
	}
	tooLarge := func(size string) *requestError {
		return &requestError{http.StatusRequestEntityTooLarge, fmt.Errorf(
			"the AdmissionReview is %slarger than the %d bytes this webhook reads; no object it reviews is that large (the API server stores objects of at most 1.5 MiB)", size, limit)}
	}
	// Refused unread when the request says its size.
	if r.ContentLength > limit {
		return nil, tooLarge(fmt.Sprintf("%d bytes, ", r.ContentLength))
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var maxBytes *http.MaxBytesError
		if errors.As(err, &maxBytes) {
			return nil, tooLarge("")
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
