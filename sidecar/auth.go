package sidecar

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// tokenReviewer creates TokenReviews; the typed client's AuthenticationV1().TokenReviews() is
// one, a fake in the unit tests another.
type tokenReviewer interface {
	Create(ctx context.Context, review *authenticationv1.TokenReview, opts metav1.CreateOptions) (*authenticationv1.TokenReview, error)
}

var _ tokenReviewer = authenticationv1client.TokenReviewInterface(nil)

// authorizationKey is the gRPC metadata key of the caller's token. gRPC lower-cases keys.
const authorizationKey = "authorization"

// reviewResult is what a TokenReview said about one token. Only the outcome is kept: never the
// token.
type reviewResult struct {
	authenticated bool
	user          string
	// problem says why a token was not accepted, for the caller's error message.
	problem string
}

// Failed TokenReviews allowed per peer address: a burst of failedReviewBurst, then one every
// failedReviewEvery. Beyond that, new tokens from the peer are refused without a review.
const (
	failedReviewBurst = 10
	failedReviewEvery = time.Second
)

// authenticator checks the bearer token of every call with a TokenReview and the caller's
// user name against the allowed list. Results are cached by a hash of the token, for a short
// time, and concurrent reviews of the same token are folded into one, so that a sweep of many
// calls with one token costs one API request. Accepted and rejected tokens are cached apart, so
// that a flood of bogus tokens cannot evict the controller's, and each peer address may cost only
// a few failed reviews (failedReviewBurst, then one per failedReviewEvery).
type authenticator struct {
	reviews  tokenReviewer
	audience string
	allowed  []string
	okTTL    time.Duration
	failTTL  time.Duration
	timeout  time.Duration
	clock    clock.PassiveClock
	// accepted and rejected hold review results by token hash.
	accepted *utilcache.LRUExpireCache
	rejected *utilcache.LRUExpireCache
	// peers holds a *rate.Limiter of failed reviews per peer host.
	peers    *utilcache.LRUExpireCache
	inflight singleflight.Group
	metrics  *Metrics
}

func newAuthenticator(reviews tokenReviewer, o *Options, metrics *Metrics, clk clock.PassiveClock) *authenticator {
	return &authenticator{
		reviews:  reviews,
		audience: healerv1alpha1.NodeTokenAudience(o.TokenAudience, o.NodeName),
		allowed:  slices.Clone(o.AllowedIdentities),
		okTTL:    o.AuthCacheTTL,
		failTTL:  o.AuthFailureCacheTTL,
		timeout:  10 * time.Second,
		clock:    clk,
		accepted: utilcache.NewLRUExpireCacheWithClock(o.AuthCacheSize, clk),
		rejected: utilcache.NewLRUExpireCacheWithClock(o.AuthCacheSize, clk),
		peers:    utilcache.NewLRUExpireCacheWithClock(o.AuthCacheSize, clk),
		metrics:  metrics,
	}
}

// callerKey is the context key of the authenticated caller's user name.
type callerKey struct{}

// callerOf returns the user name that admitted the call, or "".
func callerOf(ctx context.Context) string {
	user, _ := ctx.Value(callerKey{}).(string)
	return user
}

// authenticate returns the caller's user name, or a gRPC status error: UNAUTHENTICATED for a
// missing or invalid token, PERMISSION_DENIED for a valid token of another identity,
// UNAVAILABLE when the token could not be reviewed.
func (a *authenticator) authenticate(ctx context.Context) (string, error) {
	token, err := bearerToken(ctx)
	if err != nil {
		a.metrics.authFailure(authMissingToken)
		return "", err
	}
	res, err := a.review(ctx, token)
	if errors.Is(err, errTooManyFailures) {
		a.metrics.authFailure(authRateLimited)
		return "", status.Error(codes.ResourceExhausted, err.Error())
	}
	if err != nil {
		a.metrics.authFailure(authReviewError)
		klog.FromContext(ctx).Error(err, "Cannot review the caller's token")
		return "", status.Errorf(codes.Unavailable, "the sidecar cannot verify the token now (TokenReview failed: %v); retry later", err)
	}
	if !res.authenticated {
		a.metrics.authFailure(authInvalidToken)
		return "", status.Errorf(codes.Unauthenticated, "the token was rejected: %s", res.problem)
	}
	if !slices.Contains(a.allowed, res.user) {
		a.metrics.authFailure(authForbiddenIdentity)
		return "", status.Errorf(codes.PermissionDenied,
			"caller %q is not allowed; the sidecar accepts %s (--allowed-identities)", res.user, strings.Join(a.allowed, ", "))
	}
	return res.user, nil
}

// bearerToken reads the token from the call's "authorization: Bearer <token>" metadata.
func bearerToken(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get(authorizationKey)
	if len(values) == 0 {
		return "", status.Error(codes.Unauthenticated,
			`no token: send the ServiceAccount token in the gRPC metadata "authorization: Bearer <token>"`)
	}
	if len(values) > 1 {
		return "", status.Error(codes.Unauthenticated, `more than one "authorization" metadata value; send exactly one`)
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(values[0]), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", status.Error(codes.Unauthenticated, `the "authorization" metadata must be "Bearer <token>"`)
	}
	return token, nil
}

// errTooManyFailures refuses a token that would need a review, from a peer whose recent tokens
// failed too often.
var errTooManyFailures = errors.New("too many failed authentications")

// review returns the cached result for token, or makes one TokenReview however many callers
// ask at once. A failed request (API unreachable) is returned as an error and not cached. A
// token that needs a review, from a peer over its failure budget, gets errTooManyFailures
// without one.
func (a *authenticator) review(ctx context.Context, token string) (reviewResult, error) {
	sum := sha256.Sum256([]byte(token))
	key := hex.EncodeToString(sum[:])
	if v, ok := a.accepted.Get(key); ok {
		return v.(reviewResult), nil
	}
	if v, ok := a.rejected.Get(key); ok {
		return v.(reviewResult), nil
	}
	host := peerHost(ctx)
	v, err, _ := a.inflight.Do(key, func() (any, error) {
		// The peer's failure budget is reserved by the one review of the token, and given back
		// when the token passes or cannot be reviewed.
		now := a.clock.Now()
		r := a.limiter(host).ReserveN(now, 1)
		if d := r.DelayFrom(now); !r.OK() || d > 0 {
			r.CancelAt(now)
			return nil, fmt.Errorf("%w from %s: the sidecar reviews no new token from there for %s", errTooManyFailures, host, d.Round(time.Millisecond))
		}
		// The review outlives any one caller that waits for it, so it gets its own deadline.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.timeout)
		defer cancel()
		res, err := a.tokenReview(rctx, token)
		if err != nil {
			r.CancelAt(now)
			return nil, err
		}
		if res.authenticated {
			r.CancelAt(now)
			a.accepted.Add(key, res, a.okTTL)
		} else {
			a.rejected.Add(key, res, a.failTTL)
		}
		return res, nil
	})
	if err != nil {
		return reviewResult{}, err
	}
	return v.(reviewResult), nil
}

// limiter returns the failure budget of a peer host.
func (a *authenticator) limiter(host string) *rate.Limiter {
	if v, ok := a.peers.Get(host); ok {
		return v.(*rate.Limiter)
	}
	lim := rate.NewLimiter(rate.Every(failedReviewEvery), failedReviewBurst)
	// A peer idle for as long as its budget takes to refill starts afresh.
	a.peers.Add(host, lim, failedReviewBurst*failedReviewEvery)
	return lim
}

// peerHost is the caller's address without its port: a client's connections share a budget.
func peerHost(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "unknown peer"
	}
	if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
		return host
	}
	return p.Addr.String()
}

func (a *authenticator) tokenReview(ctx context.Context, token string) (reviewResult, error) {
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{a.audience}}}
	out, err := a.reviews.Create(ctx, tr, metav1.CreateOptions{})
	if err != nil {
		return reviewResult{}, fmt.Errorf("create TokenReview: %w", err)
	}
	st := out.Status
	switch {
	case !st.Authenticated:
		problem := st.Error
		if problem == "" {
			problem = "the API server did not authenticate it"
		}
		return reviewResult{problem: problem}, nil
	case !slices.Contains(st.Audiences, a.audience):
		return reviewResult{problem: fmt.Sprintf("it is not valid for the audience %q of this node's sidecar (--token-audience and --node-name)", a.audience)}, nil
	case st.User.Username == "":
		return reviewResult{problem: "the TokenReview named no user"}, nil
	}
	return reviewResult{authenticated: true, user: st.User.Username}, nil
}
