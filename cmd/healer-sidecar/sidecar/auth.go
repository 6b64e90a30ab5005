package sidecar

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
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

// authenticator checks the bearer token of every call with a TokenReview and the caller's
// user name against the allowed list. Results are cached by a hash of the token, for a short
// time, and concurrent reviews of the same token are folded into one, so that a sweep of many
// calls with one token costs one API request.
type authenticator struct {
	reviews  tokenReviewer
	audience string
	allowed  []string
	okTTL    time.Duration
	failTTL  time.Duration
	timeout  time.Duration
	cache    *utilcache.LRUExpireCache
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
		cache:    utilcache.NewLRUExpireCacheWithClock(o.AuthCacheSize, clk),
		metrics:  metrics,
	}
}

// interceptor rejects a call whose caller is not authenticated and allowed, before its handler
// runs.
func (a *authenticator) interceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	user, err := a.authenticate(ctx)
	if err != nil {
		return nil, err
	}
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithValues("caller", user))
	return handler(ctx, req)
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

// review returns the cached result for token, or makes one TokenReview however many callers
// ask at once. A failed request (API unreachable) is returned as an error and not cached.
func (a *authenticator) review(ctx context.Context, token string) (reviewResult, error) {
	sum := sha256.Sum256([]byte(token))
	key := hex.EncodeToString(sum[:])
	if v, ok := a.cache.Get(key); ok {
		return v.(reviewResult), nil
	}
	v, err, _ := a.inflight.Do(key, func() (any, error) {
		// The review outlives any one caller that waits for it, so it gets its own deadline.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.timeout)
		defer cancel()
		res, err := a.tokenReview(rctx, token)
		if err != nil {
			return nil, err
		}
		ttl := a.okTTL
		if !res.authenticated {
			ttl = a.failTTL
		}
		a.cache.Add(key, res, ttl)
		return res, nil
	})
	if err != nil {
		return reviewResult{}, err
	}
	return v.(reviewResult), nil
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
