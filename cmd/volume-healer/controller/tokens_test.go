package controller

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/test/controlplane"
)

// TestNodeTokensAgainstRealAPIServer requests the controller's sidecar tokens from a real API
// server: the token for node A is the controller's and is accepted for node A's audience alone
// (not node B's, not every sidecar's, not the API server's); it is reused until four fifths of its
// life have passed, then replaced; and a token file of no ServiceAccount is refused with the file
// and the reason.
func TestNodeTokensAgainstRealAPIServer(t *testing.T) {
	env := controlplane.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cs := env.Clientset
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "healer"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts("healer").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "controller"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := controlplane.WriteServiceAccountToken(ctx, cs, "healer", "controller", time.Hour, tokenFile); err != nil {
		t.Fatal(err)
	}
	clk := testingclock.NewFakeClock(time.Now())
	tokens := newNodeTokens(cs.CoreV1(), tokenFile, "site-sidecars", clk)

	review := func(token, audience string) authenticationv1.TokenReviewStatus {
		t.Helper()
		tr, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{
			Token: token, Audiences: []string{audience},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status
	}
	tokA, err := tokens.Token(ctx, "node-a")
	if err != nil {
		t.Fatalf("token for node-a: %v", err)
	}
	audA := healerv1alpha1.NodeTokenAudience("site-sidecars", "node-a")
	if st := review(tokA, audA); !st.Authenticated || st.User.Username != "system:serviceaccount:healer:controller" {
		t.Errorf("node-a's token reviewed for node-a: %+v, want the controller's ServiceAccount", st)
	}
	for _, other := range []string{healerv1alpha1.NodeTokenAudience("site-sidecars", "node-b"), "site-sidecars", healerv1alpha1.DefaultTokenAudience} {
		if st := review(tokA, other); st.Authenticated {
			t.Errorf("node-a's token is accepted for the audience %q", other)
		}
	}

	if again, _ := tokens.Token(ctx, "node-a"); again != tokA {
		t.Error("a second call for node-a within the token's life requested a new token")
	}
	tokB, err := tokens.Token(ctx, "node-b")
	if err != nil || tokB == tokA {
		t.Fatalf("token for node-b: %v (same as node-a's: %v)", err, tokB == tokA)
	}
	// TokenRequest tokens carry second-precision times: a second later, node-a's is a new token.
	clk.Step(nodeTokenLifetime*4/5 + time.Second)
	time.Sleep(1100 * time.Millisecond)
	renewed, err := tokens.Token(ctx, "node-a")
	if err != nil || renewed == tokA {
		t.Errorf("node-a's token after four fifths of its life: %v (unchanged: %v)", err, renewed == tokA)
	}

	notSA := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(notSA, []byte("eyJhbGciOiJub25lIn0.eyJzdWIiOiJhZG1pbiJ9.x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = newNodeTokens(cs.CoreV1(), notSA, "site-sidecars", clk).Token(ctx, "node-a")
	if err == nil || !strings.Contains(err.Error(), notSA) || !strings.Contains(err.Error(), `subject "admin" is not a ServiceAccount`) {
		t.Errorf("a token file of the user admin: %v, want it refused, naming the file and its subject", err)
	}
}
