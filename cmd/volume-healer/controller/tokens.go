package controller

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/clock"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/probe"
)

// nodeTokenLifetime is how long each node's token is valid: the shortest lifetime the
// TokenRequest API grants.
const nodeTokenLifetime = 10 * time.Minute

// nodeTokenTimeout bounds one TokenRequest.
const nodeTokenTimeout = 10 * time.Second

// nodeTokens gives the controller's token for the sidecars of each node: a token of the
// controller's ServiceAccount from the TokenRequest API, for the audience
// healerv1alpha1.NodeTokenAudience(audience, node) alone, valid ten minutes and requested again
// once four fifths of that have passed. A sidecar reviews the token it gets against its own
// node's audience, so a token captured on one node opens no other node's sidecar, and it is
// worthless against the API server. One request per node every eight minutes, whatever the
// number of calls.
type nodeTokens struct {
	accounts  typedcorev1.ServiceAccountsGetter
	tokenFile string
	audience  string
	clock     clock.PassiveClock

	mu sync.Mutex
	// namespace and name are the controller's ServiceAccount, once read from tokenFile.
	namespace, name string
	tokens          map[string]nodeToken
	inflight        singleflight.Group
}

var _ probe.TokenSource = (*nodeTokens)(nil)

type nodeToken struct {
	token            string
	renew, expiresAt time.Time
}

// newNodeTokens requests tokens for the ServiceAccount that the token in tokenFile belongs to:
// the controller's own, as its pod mounts it. The file is read at the first call to a sidecar,
// and again after a failure to read it.
func newNodeTokens(accounts typedcorev1.ServiceAccountsGetter, tokenFile, audience string, clk clock.PassiveClock) *nodeTokens {
	return &nodeTokens{accounts: accounts, tokenFile: tokenFile, audience: audience, clock: clk, tokens: map[string]nodeToken{}}
}

// account returns the controller's ServiceAccount, read from tokenFile once.
func (n *nodeTokens) account() (namespace, name string, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.name == "" {
		if n.namespace, n.name, err = serviceAccountOf(n.tokenFile); err != nil {
			return "", "", err
		}
	}
	return n.namespace, n.name, nil
}

// Token returns the cached token of node, or requests one.
func (n *nodeTokens) Token(ctx context.Context, node string) (string, error) {
	if node == "" {
		return "", fmt.Errorf("a call to a sidecar names no node: no token can be issued for it")
	}
	now := n.clock.Now()
	n.mu.Lock()
	t, ok := n.tokens[node]
	n.mu.Unlock()
	if ok && now.Before(t.renew) {
		return t.token, nil
	}
	v, err, _ := n.inflight.Do(node, func() (any, error) {
		// The request outlives any one caller that waits for it, so it gets its own deadline.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), nodeTokenTimeout)
		defer cancel()
		return n.request(rctx, node)
	})
	if err != nil {
		if ok && now.Before(t.expiresAt) {
			// The API server is unreachable: the old token is still good for a while.
			return t.token, nil
		}
		return "", err
	}
	return v.(string), nil
}

func (n *nodeTokens) request(ctx context.Context, node string) (string, error) {
	namespace, name, err := n.account()
	if err != nil {
		return "", err
	}
	seconds := int64(nodeTokenLifetime / time.Second)
	audience := healerv1alpha1.NodeTokenAudience(n.audience, node)
	issued := n.clock.Now()
	tr, err := n.accounts.ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: &seconds},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("request a token of ServiceAccount %s/%s for the sidecars of node %s (audience %q; the controller needs create on serviceaccounts/token for itself): %w",
			namespace, name, node, audience, err)
	}
	expires := tr.Status.ExpirationTimestamp.Time
	if expires.IsZero() || !expires.After(issued) {
		expires = issued.Add(nodeTokenLifetime)
	}
	t := nodeToken{token: tr.Status.Token, renew: issued.Add(expires.Sub(issued) * 4 / 5), expiresAt: expires}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.tokens[node] = t
	// Forget the tokens of nodes no longer called (gone, or without volumes).
	for other, ot := range n.tokens {
		if !issued.Before(ot.expiresAt) {
			delete(n.tokens, other)
		}
	}
	return t.token, nil
}

// serviceAccountOf reads whose ServiceAccount token file holds: the namespace and name in its
// subject, "system:serviceaccount:<namespace>:<name>". The signature is not checked: the file is
// the controller's own, and the API server judges every token requested with the answer.
func serviceAccountOf(tokenFile string) (namespace, name string, err error) {
	data, err := os.ReadFile(tokenFile)
	if err != nil {
		return "", "", fmt.Errorf("sidecar.auth.tokenFile: %w", err)
	}
	parts := strings.Split(strings.TrimSpace(string(data)), ".")
	if len(parts) != 3 {
		return "", "", fmt.Errorf("sidecar.auth.tokenFile %s: not a ServiceAccount token (a JWT of three parts)", tokenFile)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", "", fmt.Errorf("sidecar.auth.tokenFile %s: the token's claims are not base64url: %w", tokenFile, err)
	}
	var claims struct {
		Subject string `json:"sub"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return "", "", fmt.Errorf("sidecar.auth.tokenFile %s: the token's claims are not JSON: %w", tokenFile, err)
	}
	rest, ok := strings.CutPrefix(claims.Subject, "system:serviceaccount:")
	namespace, name, found := strings.Cut(rest, ":")
	if !ok || !found || namespace == "" || name == "" {
		return "", "", fmt.Errorf("sidecar.auth.tokenFile %s: the token's subject %q is not a ServiceAccount (system:serviceaccount:<namespace>:<name>)", tokenFile, claims.Subject)
	}
	return namespace, name, nil
}
