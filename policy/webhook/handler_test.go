package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/policy"
)

const policyNamespace = "volume-healer"

// policyConfigMap returns a policy ConfigMap of the policy namespace holding rego as policy.rego.
func policyConfigMap(name, rego string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: policyNamespace, Name: name,
			Labels: map[string]string{annotations.PolicyLabel: annotations.PolicyLabelValue}},
		Data: map[string]string{"policy.rego": rego},
	}
}

const (
	goodPolicy   = "package volumehealer\n\ndecision := {\"action\": \"skip\", \"reason\": \"Good\"}\n"
	brokenPolicy = "package volumehealer\n\n# A brace short.\ndecision := {\"action\": \"skip\", \"reason\": \"Broken\"\n"
)

// startSource runs the controller's ConfigMapSource over a fake clientset holding objs, and
// returns it once it has read them.
func startSource(t *testing.T, objs ...runtime.Object) *policy.ConfigMapSource {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	client := fake.NewClientset(objs...)
	engine, err := policy.NewEngine(ctx, policy.Options{Compile: policy.CompileOptions{EvalTimeout: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	src, err := policy.NewConfigMapSource(client, engine, policy.ConfigMapOptions{Namespace: policyNamespace})
	if err != nil {
		t.Fatal(err)
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	if err := src.Watch(factory); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	t.Cleanup(func() {
		cancel() // first: Shutdown waits for the informers, which stop with ctx
		factory.Shutdown()
	})
	go func() { _ = src.Start(ctx) }()
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return src.HasSynced(), nil
	}); err != nil {
		t.Fatalf("the policy source did not read the ConfigMaps: %v", err)
	}
	return src
}

// reviewOf builds the AdmissionReview the API server sends for op on cm (old for an update or a
// delete).
func reviewOf(t *testing.T, op admissionv1.Operation, kind metav1.GroupVersionKind, cm, old any) []byte {
	t.Helper()
	raw := func(o any) runtime.RawExtension {
		if o == nil {
			return runtime.RawExtension{}
		}
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		return runtime.RawExtension{Raw: b}
	}
	name := "site-policy"
	for _, o := range []any{cm, old} {
		if c, ok := o.(*corev1.ConfigMap); ok {
			name = c.Name
		}
	}
	dryRun := false
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID("0d3c5e8e-6f5c-4d52-9b5e-0b1f3c8e2a11"),
			Kind:      kind,
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
			Namespace: policyNamespace,
			Name:      name,
			Operation: op,
			UserInfo:  authenticationv1.UserInfo{Username: "alice"},
			Object:    raw(cm),
			OldObject: raw(old),
			DryRun:    &dryRun,
		},
	}
	b, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// post sends body to h as the API server does and returns the HTTP response.
func post(t *testing.T, h http.Handler, contentType string, body []byte) *http.Response {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, Path+"?timeout=10s", bytes.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

// TestHandlerJudgesPolicyChanges sends the reviews the API server sends and reads the answers as
// the API server does: the UID echoed, allowed or denied, and for a denial the message kubectl
// prints.
func TestHandlerJudgesPolicyChanges(t *testing.T) {
	stored := policyConfigMap("site-policy", goodPolicy)
	src := startSource(t, stored)
	reg := prometheus.NewRegistry()
	metrics := NewMetrics(reg)
	h := NewHandler(src, metrics, Limits{})
	cm := metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
	unlabelled := policyConfigMap("draft", brokenPolicy)
	unlabelled.Labels = nil

	tests := map[string]struct {
		review      []byte
		allowed     bool
		message     []string // substrings of the denial
		warning     string
		wantResults map[string]float64
	}{
		"a good policy created": {
			review:  reviewOf(t, admissionv1.Create, cm, policyConfigMap("site-policy", strings.Replace(goodPolicy, "Good", "Better", 1)), nil),
			allowed: true,
		},
		"a syntax error created": {
			review: reviewOf(t, admissionv1.Create, cm, policyConfigMap("second", brokenPolicy), nil),
			message: []string{"ConfigMap volume-healer/second: policy rejected (parse) in volume-healer/second/policy.rego",
				"volume-healer/second/policy.rego:5", "rego_parse_error"},
		},
		"an update that breaks the stored policy": {
			review:  reviewOf(t, admissionv1.Update, cm, policyConfigMap("site-policy", brokenPolicy), stored),
			message: []string{"ConfigMap volume-healer/site-policy: policy rejected (parse)", "volume-healer/site-policy/policy.rego:5"},
		},
		"an update that calls a forbidden built-in": {
			review: reviewOf(t, admissionv1.Update, cm, policyConfigMap("site-policy",
				"package volumehealer\n\ndecision := {\"action\": \"skip\", \"reason\": http.send({\"method\": \"GET\", \"url\": \"http://127.0.0.1:1\"}).body}\n"), stored),
			message: []string{"policy rejected (forbidden_builtin)", "volume-healer/site-policy/policy.rego:3", "http.send is not allowed"},
		},
		"a broken ConfigMap without the policy label": {
			review:  reviewOf(t, admissionv1.Create, cm, unlabelled, nil),
			allowed: true,
		},
		"a delete of the only policy": {
			review:  reviewOf(t, admissionv1.Delete, cm, nil, stored),
			allowed: true,
		},
		"a Secret sent by a webhook configuration that selects too much": {
			review:  reviewOf(t, admissionv1.Create, metav1.GroupVersionKind{Version: "v1", Kind: "Secret"}, map[string]any{"metadata": map[string]any{"name": "s"}}, nil),
			allowed: true,
			warning: "judges v1 ConfigMaps only, not /v1, Kind=Secret",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			resp := post(t, h, "application/json", tc.review)
			if resp.StatusCode != http.StatusOK {
				body, _ := io.ReadAll(resp.Body)
				t.Fatalf("HTTP %s: %s", resp.Status, body)
			}
			var got admissionv1.AdmissionReview
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
				t.Fatal(err)
			}
			if got.APIVersion != "admission.k8s.io/v1" || got.Kind != "AdmissionReview" || got.Response == nil {
				t.Fatalf("answer %+v, want an admission.k8s.io/v1 AdmissionReview with a response", got)
			}
			if got.Response.UID != "0d3c5e8e-6f5c-4d52-9b5e-0b1f3c8e2a11" {
				t.Errorf("response UID %q, want the request's", got.Response.UID)
			}
			if got.Response.Allowed != tc.allowed {
				t.Fatalf("allowed = %v, want %v (result %+v)", got.Response.Allowed, tc.allowed, got.Response.Result)
			}
			if !tc.allowed {
				st := got.Response.Result
				if st == nil || st.Code != http.StatusForbidden || st.Reason != metav1.StatusReasonForbidden {
					t.Fatalf("denial result %+v, want 403 Forbidden", st)
				}
				for _, w := range tc.message {
					if !strings.Contains(st.Message, w) {
						t.Errorf("denial message %q does not hold %q", st.Message, w)
					}
				}
			}
			if tc.warning != "" && (len(got.Response.Warnings) != 1 || !strings.Contains(got.Response.Warnings[0], tc.warning)) {
				t.Errorf("warnings %q, want one holding %q", got.Response.Warnings, tc.warning)
			}
		})
	}

	if got := testutil.ToFloat64(metrics.reviews[ResultAllowed]); got != 4 {
		t.Errorf("volume_healer_webhook_reviews_total{result=allowed} = %v, want 4", got)
	}
	if got := testutil.ToFloat64(metrics.reviews[ResultDenied]); got != 3 {
		t.Errorf("volume_healer_webhook_reviews_total{result=denied} = %v, want 3", got)
	}
	if n, err := testutil.GatherAndCount(reg, "volume_healer_webhook_review_duration_seconds"); err != nil || n != 1 {
		t.Errorf("volume_healer_webhook_review_duration_seconds: %d series, %v", n, err)
	}
}

// TestHandlerRefusesWhatItCannotRead: a request that is no AdmissionReview v1 of a ConfigMap gets
// an HTTP error, which makes the API server apply the failurePolicy, with a message that says
// what was wrong; it is counted as an error.
func TestHandlerRefusesWhatItCannotRead(t *testing.T) {
	stored := policyConfigMap("site-policy", goodPolicy)
	src := startSource(t, stored)
	metrics := NewMetrics(prometheus.NewRegistry())
	h := NewHandler(src, metrics, Limits{})
	cm := metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
	v1beta1 := bytes.Replace(reviewOf(t, admissionv1.Create, cm, stored, nil), []byte("admission.k8s.io/v1"), []byte("admission.k8s.io/v1beta1"), 1)

	tests := map[string]struct {
		method, contentType string
		body                []byte
		code                int
		message             string
	}{
		"not JSON":                 {body: []byte("{\"apiVersion\": "), code: http.StatusBadRequest, message: "decoding the AdmissionReview"},
		"a v1beta1 review":         {body: v1beta1, code: http.StatusBadRequest, message: "admissionReviewVersions"},
		"a review without request": {body: []byte(`{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}`), code: http.StatusBadRequest, message: "no request"},
		"an object that is no ConfigMap": {
			body: reviewOf(t, admissionv1.Create, cm, map[string]any{"metadata": map[string]any{"name": "x"}, "data": 5}, nil),
			code: http.StatusBadRequest, message: "CREATE of ConfigMap volume-healer/site-policy: object: not a ConfigMap"},
		"a create without object": {body: reviewOf(t, admissionv1.Create, cm, nil, nil), code: http.StatusBadRequest, message: "object: missing"},
		"a GET":                   {method: http.MethodGet, code: http.StatusMethodNotAllowed, message: "comes with POST"},
		"YAML":                    {contentType: "application/yaml", body: []byte("apiVersion: admission.k8s.io/v1"), code: http.StatusUnsupportedMediaType, message: "application/json"},
		"a body past the limit":   {body: bytes.Repeat([]byte(" "), DefaultMaxReviewBytes+1), code: http.StatusRequestEntityTooLarge, message: "larger than"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			method, contentType := tc.method, tc.contentType
			if method == "" {
				method = http.MethodPost
			}
			if contentType == "" {
				contentType = "application/json; charset=utf-8"
			}
			req := httptest.NewRequest(method, Path, bytes.NewReader(tc.body))
			req.Header.Set("Content-Type", contentType)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.message) {
				t.Errorf("HTTP %d %q, want %d with %q", rec.Code, rec.Body.String(), tc.code, tc.message)
			}
		})
	}
	if got := testutil.ToFloat64(metrics.reviews[ResultError]); got != float64(len(tests)) {
		t.Errorf("volume_healer_webhook_reviews_total{result=error} = %v, want %d", got, len(tests))
	}
}

// TestHandlerBeforeThePoliciesAreRead: until the controller has read the policy ConfigMaps it
// cannot judge a change, and says so with 503, so that the failurePolicy decides.
func TestHandlerBeforeThePoliciesAreRead(t *testing.T) {
	engine, err := policy.NewEngine(context.Background(), policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	src, err := policy.NewConfigMapSource(fake.NewClientset(), engine, policy.ConfigMapOptions{Namespace: policyNamespace})
	if err != nil {
		t.Fatal(err)
	}
	body := reviewOf(t, admissionv1.Create, metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, policyConfigMap("site-policy", goodPolicy), nil)
	resp := post(t, NewHandler(src, nil, Limits{}), "application/json", body)
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(msg), "have not been read yet") {
		t.Errorf("HTTP %s %q, want 503 saying the policies are not read yet", resp.Status, msg)
	}
}
