package webhook

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// heldChecker allows every change, once release is closed; it counts the checks that started and
// keeps the context of the last one.
type heldChecker struct {
	release chan struct{}
	started atomic.Int32
	mu      sync.Mutex
	ctx     context.Context
}

func newHeldChecker() *heldChecker { return &heldChecker{release: make(chan struct{})} }

func (c *heldChecker) Check(ctx context.Context, _, _ *corev1.ConfigMap) error {
	c.mu.Lock()
	c.ctx = ctx
	c.mu.Unlock()
	c.started.Add(1)
	select {
	case <-c.release:
	case <-ctx.Done():
	}
	return nil
}

func (c *heldChecker) lastContext() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ctx
}

var configMapGVK = metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}

// countingReader counts the bytes read from it.
type countingReader struct {
	r    io.Reader
	read atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// TestReviewPastTheSizeLimitIsRefusedUnread: a body whose Content-Length is past the limit is
// refused with 413 and a message naming both sizes, before a byte of it is read or decoded; a
// body without Content-Length is cut at the limit, and never decoded.
func TestReviewPastTheSizeLimitIsRefusedUnread(t *testing.T) {
	const limit = 64 << 10
	checker := newHeldChecker()
	close(checker.release)
	h := NewHandler(checker, nil, Limits{MaxReviewBytes: limit})
	big := reviewOf(t, admissionv1.Create, configMapGVK, policyConfigMap("big", strings.Repeat("#", 2*limit)), nil)

	body := &countingReader{r: bytes.NewReader(big)}
	req := httptest.NewRequest(http.MethodPost, Path, body)
	req.ContentLength = int64(len(big))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("HTTP %d %q, want 413", rec.Code, rec.Body.String())
	}
	for _, want := range []string{"AdmissionReview", "65536 bytes"} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("message %q does not say %q", rec.Body.String(), want)
		}
	}
	if n := body.read.Load(); n > 0 {
		t.Errorf("read %d bytes of a body whose Content-Length (%d) is past the limit (%d); want none", n, len(big), limit)
	}

	chunked := &countingReader{r: bytes.NewReader(big)}
	req = httptest.NewRequest(http.MethodPost, Path, chunked)
	req.ContentLength = -1
	req.Header.Set("Content-Type", "application/json")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("without Content-Length: HTTP %d %q, want 413", rec.Code, rec.Body.String())
	}
	if n := chunked.read.Load(); n > limit+64<<10 {
		t.Errorf("without Content-Length: read %d bytes, want the reading stopped near the limit (%d)", n, limit)
	}
	if n := checker.started.Load(); n != 0 {
		t.Errorf("%d reviews past the limit reached the checker, want none", n)
	}
}

// TestReviewsPastTheCapAreRefusedAtOnce: with MaxInFlight reviews being judged, another is
// answered at once with 429, unread, so that the API server applies the failurePolicy; once a
// slot frees, reviews are judged again.
func TestReviewsPastTheCapAreRefusedAtOnce(t *testing.T) {
	checker := newHeldChecker()
	h := NewHandler(checker, nil, Limits{MaxInFlight: 2})
	body := reviewOf(t, admissionv1.Create, configMapGVK, policyConfigMap("site-policy", goodPolicy), nil)
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = post(t, h, "application/json", body).StatusCode
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for checker.started.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	excess := &countingReader{r: bytes.NewReader(body)}
	req := httptest.NewRequest(http.MethodPost, Path+"?timeout=10s", excess)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	took := time.Since(start)
	close(checker.release)
	wg.Wait()
	if rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), "failurePolicy") {
		t.Errorf("a third review while two are judged: HTTP %d %q after %s, want 429 naming the failurePolicy", rec.Code, rec.Body.String(), took)
	}
	if took > time.Second || excess.read.Load() > 0 {
		t.Errorf("the refused review took %s and %d bytes were read; want an answer at once, unread", took, excess.read.Load())
	}
	if codes[0] != http.StatusOK || codes[1] != http.StatusOK {
		t.Errorf("the two reviews in flight: HTTP %v, want 200", codes)
	}
	if got := post(t, h, "application/json", body).StatusCode; got != http.StatusOK {
		t.Errorf("a review after the others ended: HTTP %d, want 200", got)
	}
}

// TestReviewJudgementHasADeadline: a judgement runs under a deadline even when the API server
// names none, and its context ends when the request does.
func TestReviewJudgementHasADeadline(t *testing.T) {
	checker := newHeldChecker()
	close(checker.release)
	h := NewHandler(checker, nil, Limits{CheckTimeout: 3 * time.Second})
	body := reviewOf(t, admissionv1.Create, configMapGVK, policyConfigMap("site-policy", goodPolicy), nil)
	tests := map[string]struct {
		query string
		want  time.Duration
	}{
		"the API server names no timeout":  {want: 3 * time.Second},
		"the API server's shorter timeout": {query: "?timeout=1s", want: time.Second},
		"the API server's longer timeout":  {query: "?timeout=30s", want: 3 * time.Second},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, Path+tc.query, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			start := time.Now()
			h.ServeHTTP(httptest.NewRecorder(), req)
			ctx := checker.lastContext()
			deadline, ok := ctx.Deadline()
			if !ok {
				t.Fatal("the judgement ran without a deadline")
			}
			if left := deadline.Sub(start); left > tc.want+100*time.Millisecond || left < tc.want-time.Second {
				t.Errorf("the judgement's deadline was %s after the request, want %s", left, tc.want)
			}
			if ctx.Err() == nil {
				t.Error("the judgement's context is still live after the request ended")
			}
		})
	}
}

// chartMemoryLimit reads the controller's memory limit from the chart's values.
func chartMemoryLimit(t *testing.T) int64 {
	t.Helper()
	raw, err := os.ReadFile("../../deploy/helm/volume-healer/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Resources struct {
			Limits struct {
				Memory string `json:"memory"`
			} `json:"limits"`
		} `json:"resources"`
	}
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	q, err := resource.ParseQuantity(values.Resources.Limits.Memory)
	if err != nil {
		t.Fatalf("resources.limits.memory in the chart's values: %v", err)
	}
	return q.Value()
}

// heapBytes is the memory of the heap's objects, live and not yet collected.
func heapBytes() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// TestConcurrentLargeReviewsFitTheMemoryLimit sends many reviews near the size limit at once, as
// any pod that reaches the webhook port could, and holds every judgement until all of them are
// in: the heap must grow by less than the controller's memory limit in the chart.
func TestConcurrentLargeReviewsFitTheMemoryLimit(t *testing.T) {
	const reviews = 48
	limit := chartMemoryLimit(t)
	checker := newHeldChecker()
	h := NewHandler(checker, nil, Limits{})
	// One body, shared by every request, so that only the webhook's own memory grows.
	body := reviewOf(t, admissionv1.Create, configMapGVK, policyConfigMap("big", strings.Repeat("#", DefaultMaxReviewBytes-4096)), nil)
	if len(body) > DefaultMaxReviewBytes {
		t.Fatalf("the review is %d bytes, past the limit", len(body))
	}
	runtime.GC()
	base := heapBytes()
	var peak atomic.Int64
	sampled := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if n := heapBytes() - base; n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	var answered atomic.Int32
	var wg sync.WaitGroup
	for range reviews {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer answered.Add(1)
			post(t, h, "application/json", body)
		}()
	}
	deadline := time.Now().Add(time.Minute)
	for answered.Load()+checker.started.Load() < reviews && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// Every review is in a judgement or answered: what the judgements hold is live now.
	runtime.GC()
	if n := heapBytes() - base; n > peak.Load() {
		peak.Store(n)
	}
	judged := checker.started.Load()
	close(checker.release)
	wg.Wait()
	close(stop)
	<-sampled
	t.Logf("%d reviews of %d bytes at once, %d judged at once: the heap grew by at most %d MiB (limit %d MiB)",
		reviews, len(body), judged, peak.Load()>>20, limit>>20)
	if peak.Load() >= limit {
		t.Errorf("the heap grew by %d MiB with %d reviews of %d bytes at once (%d judged at once); want less than the chart's memory limit, %d MiB",
			peak.Load()>>20, reviews, len(body), judged, limit>>20)
	}
}
