package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// fakeReviewer answers TokenReviews from a table of tokens and counts them.
type fakeReviewer struct {
	mu    sync.Mutex
	calls int
	// users maps a valid token to its user and audiences.
	users map[string]authenticationv1.UserInfo
	// audiences the valid tokens carry; nil: whichever the review asks for.
	audiences []string
	err       error
	// gate, when set, holds every review until it is closed.
	gate chan struct{}
}

func (f *fakeReviewer) Create(_ context.Context, tr *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	f.mu.Lock()
	f.calls++
	gate, err := f.gate, f.err
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if err != nil {
		return nil, err
	}
	out := tr.DeepCopy()
	if u, ok := f.users[tr.Spec.Token]; ok {
		auds := f.audiences
		if auds == nil {
			auds = tr.Spec.Audiences
		}
		out.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: u, Audiences: auds}
	} else {
		out.Status = authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}
	}
	return out, nil
}

func (f *fakeReviewer) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func newTestAuthenticator(t *testing.T, r tokenReviewer, mutate func(*Options)) (*authenticator, *testingclock.FakeClock, *prometheus.Registry) {
	t.Helper()
	o := &Options{KubeConfig: nil, NodeName: "node-1", TokenAudience: healerv1alpha1.DefaultTokenAudience}
	o.AllowedIdentities = []string{DefaultAllowedIdentity}
	o.AuthCacheTTL = 30 * time.Second
	o.AuthFailureCacheTTL = 10 * time.Second
	o.AuthCacheSize = 16
	if mutate != nil {
		mutate(o)
	}
	clk := testingclock.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	reg := prometheus.NewRegistry()
	return newAuthenticator(r, o, NewMetrics(reg), clk), clk, reg
}

func withAuth(value ...string) context.Context {
	md := metadata.MD{}
	for _, v := range value {
		md.Append("authorization", v)
	}
	return metadata.NewIncomingContext(context.Background(), md)
}

func TestAuthenticate(t *testing.T) {
	controller := authenticationv1.UserInfo{Username: DefaultAllowedIdentity}
	other := authenticationv1.UserInfo{Username: "system:serviceaccount:default:other"}
	tests := map[string]struct {
		ctx       context.Context
		audiences []string
		err       error
		wantCode  codes.Code
		wantUser  string
		reason    string
	}{
		"allowed token":             {ctx: withAuth("Bearer good"), wantCode: codes.OK, wantUser: DefaultAllowedIdentity},
		"scheme in lower case":      {ctx: withAuth("bearer good"), wantCode: codes.OK, wantUser: DefaultAllowedIdentity},
		"no metadata":               {ctx: context.Background(), wantCode: codes.Unauthenticated, reason: authMissingToken},
		"no authorization key":      {ctx: withAuth(), wantCode: codes.Unauthenticated, reason: authMissingToken},
		"basic credentials":         {ctx: withAuth("Basic dXNlcjpwYXNz"), wantCode: codes.Unauthenticated, reason: authMissingToken},
		"bearer without a token":    {ctx: withAuth("Bearer "), wantCode: codes.Unauthenticated, reason: authMissingToken},
		"two authorization values":  {ctx: withAuth("Bearer good", "Bearer other"), wantCode: codes.Unauthenticated, reason: authMissingToken},
		"token the API rejects":     {ctx: withAuth("Bearer forged"), wantCode: codes.Unauthenticated, reason: authInvalidToken},
		"token of another identity": {ctx: withAuth("Bearer other"), wantCode: codes.PermissionDenied, reason: authForbiddenIdentity},
		"token for the API server":  {ctx: withAuth("Bearer good"), audiences: []string{"https://kubernetes.default.svc"}, wantCode: codes.Unauthenticated, reason: authInvalidToken},
		"token for every sidecar":   {ctx: withAuth("Bearer good"), audiences: []string{healerv1alpha1.DefaultTokenAudience}, wantCode: codes.Unauthenticated, reason: authInvalidToken},
		"token for another node":    {ctx: withAuth("Bearer good"), audiences: []string{healerv1alpha1.NodeTokenAudience(healerv1alpha1.DefaultTokenAudience, "node-2")}, wantCode: codes.Unauthenticated, reason: authInvalidToken},
		"token for this node":       {ctx: withAuth("Bearer good"), audiences: []string{healerv1alpha1.NodeTokenAudience(healerv1alpha1.DefaultTokenAudience, "node-1")}, wantCode: codes.OK, wantUser: DefaultAllowedIdentity},
		"API server unreachable":    {ctx: withAuth("Bearer good"), err: errors.New("connection refused"), wantCode: codes.Unavailable, reason: authReviewError},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := &fakeReviewer{users: map[string]authenticationv1.UserInfo{"good": controller, "other": other}, audiences: tc.audiences, err: tc.err}
			a, _, reg := newTestAuthenticator(t, r, nil)
			user, err := a.authenticate(tc.ctx)
			if status.Code(err) != tc.wantCode {
				t.Fatalf("authenticate: %v, want %s", err, tc.wantCode)
			}
			if user != tc.wantUser {
				t.Errorf("user = %q, want %q", user, tc.wantUser)
			}
			if tc.reason != "" {
				if got := testutil.ToFloat64(a.metrics.authFailures.WithLabelValues(tc.reason)); got != 1 {
					t.Errorf("auth failures with reason %s = %v, want 1", tc.reason, got)
				}
			} else if n, _ := testutil.GatherAndCount(reg, "volume_healer_sidecar_auth_failures_total"); n != 0 {
				t.Errorf("an accepted call was counted as an auth failure")
			}
		})
	}
}

func TestAuthCache(t *testing.T) {
	r := &fakeReviewer{users: map[string]authenticationv1.UserInfo{"good": {Username: DefaultAllowedIdentity}}}
	a, clk, _ := newTestAuthenticator(t, r, nil)
	check := func(token string, want codes.Code, wantCalls int) {
		t.Helper()
		_, err := a.authenticate(withAuth("Bearer " + token))
		if status.Code(err) != want {
			t.Fatalf("%s: %v, want %s", token, err, want)
		}
		if r.count() != wantCalls {
			t.Fatalf("%s: %d TokenReviews so far, want %d", token, r.count(), wantCalls)
		}
	}
	check("good", codes.OK, 1)
	check("good", codes.OK, 1)
	check("bad", codes.Unauthenticated, 2)
	check("bad", codes.Unauthenticated, 2)
	// The rejection expires first: a token that became valid is accepted soon.
	clk.Step(11 * time.Second)
	check("bad", codes.Unauthenticated, 3)
	check("good", codes.OK, 3)
	clk.Step(20 * time.Second)
	check("good", codes.OK, 4)
}

func TestAuthDoesNotCacheReviewErrors(t *testing.T) {
	r := &fakeReviewer{users: map[string]authenticationv1.UserInfo{"good": {Username: DefaultAllowedIdentity}}, err: errors.New("apiserver down")}
	a, _, _ := newTestAuthenticator(t, r, nil)
	if _, err := a.authenticate(withAuth("Bearer good")); status.Code(err) != codes.Unavailable {
		t.Fatalf("with the API down: %v, want UNAVAILABLE", err)
	}
	r.mu.Lock()
	r.err = nil
	r.mu.Unlock()
	if _, err := a.authenticate(withAuth("Bearer good")); err != nil {
		t.Fatalf("with the API back: %v, want OK at once", err)
	}
}

func TestAuthFoldsConcurrentReviews(t *testing.T) {
	gate := make(chan struct{})
	r := &fakeReviewer{users: map[string]authenticationv1.UserInfo{"good": {Username: DefaultAllowedIdentity}}, gate: gate}
	a, _, _ := newTestAuthenticator(t, r, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Go(func() {
			_, err := a.authenticate(withAuth("Bearer good"))
			errs <- err
		})
	}
	// Let the calls pile up behind the first review before it answers.
	_ = poll.Until(t.Context(), 5*time.Second, "the first review", poll.True(func() bool { return r.count() > 0 }))
	time.Sleep(50 * time.Millisecond)
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("authenticate: %v", err)
		}
	}
	if n := r.count(); n != 1 {
		t.Errorf("50 concurrent calls made %d TokenReviews, want 1", n)
	}
}

// withPeer is withAuth from the address addr.
func withPeer(addr string, value ...string) context.Context {
	return peer.NewContext(withAuth(value...), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(addr), Port: 40000}})
}

// TestBogusTokensCannotAmplify floods the sidecar with distinct bogus tokens from one peer: they
// cost failedReviewBurst TokenReviews, then none until the peer's budget refills, and are refused
// with RESOURCE_EXHAUSTED; another peer, and the controller's accepted token, are not affected,
// even by more bogus tokens than the cache holds.
func TestBogusTokensCannotAmplify(t *testing.T) {
	r := &fakeReviewer{users: map[string]authenticationv1.UserInfo{"good": {Username: DefaultAllowedIdentity}, "fresh": {Username: DefaultAllowedIdentity}}}
	a, clk, _ := newTestAuthenticator(t, r, nil)
	if _, err := a.authenticate(withPeer("10.0.0.1", "Bearer good")); err != nil {
		t.Fatal(err)
	}
	limited := 0
	for i := range 100 {
		_, err := a.authenticate(withPeer("10.0.0.66", fmt.Sprintf("Bearer bogus-%d", i)))
		switch status.Code(err) {
		case codes.Unauthenticated:
		case codes.ResourceExhausted:
			limited++
			if i == 99 && !strings.Contains(err.Error(), "too many failed authentications from 10.0.0.66") {
				t.Errorf("the refusal does not name the peer: %v", err)
			}
		default:
			t.Fatalf("bogus token %d: %v", i, err)
		}
	}
	if got, want := r.count(), 1+failedReviewBurst; got != want {
		t.Errorf("100 bogus tokens from one peer cost %d TokenReviews, want %d", got-1, want-1)
	}
	if limited != 100-failedReviewBurst {
		t.Errorf("%d bogus tokens were refused without a review, want %d", limited, 100-failedReviewBurst)
	}
	if got := testutil.ToFloat64(a.metrics.authFailures.WithLabelValues(authRateLimited)); got != float64(limited) {
		t.Errorf("rate_limited failures = %v, want %d", got, limited)
	}
	// Another peer is reviewed, and a good token from the flooding peer too while it has budget.
	before := r.count()
	if _, err := a.authenticate(withPeer("10.0.0.2", "Bearer bogus-x")); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a bogus token from another peer: %v, want UNAUTHENTICATED after a review", err)
	}
	clk.Step(failedReviewEvery)
	if _, err := a.authenticate(withPeer("10.0.0.66", "Bearer fresh")); err != nil {
		t.Errorf("a valid token from the peer once its budget refilled: %v", err)
	}
	if _, err := a.authenticate(withPeer("10.0.0.66", "Bearer bogus-y")); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a valid token gives its reservation back; the next bogus one is reviewed: %v", err)
	}
	if got := r.count() - before; got != 3 {
		t.Errorf("%d TokenReviews for the last three calls, want 3", got)
	}
	// More rejected tokens than the cache holds (16 here), from many peers: the controller's
	// token stays cached.
	before = r.count()
	for i := range 64 {
		_, _ = a.authenticate(withPeer(fmt.Sprintf("10.1.0.%d", i), fmt.Sprintf("Bearer flood-%d", i)))
	}
	if got := r.count() - before; got != 64 {
		t.Fatalf("64 bogus tokens from 64 peers cost %d reviews, want 64", got)
	}
	before = r.count()
	if _, err := a.authenticate(withPeer("10.0.0.1", "Bearer good")); err != nil || r.count() != before {
		t.Errorf("the controller's token after the flood: %v, %d new reviews; want it accepted from the cache", err, r.count()-before)
	}
}
