package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/test/harness"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// signerServerName is the sidecars' --tls-server-name and the controller's sidecar.tls.serverName
// in the signer's tests.
const signerServerName = "healer-sidecar"

// signedPlugin is a node plugin whose sidecar serves TLS with a certificate that the controller's
// signer issues: each start is a new pod of the node plugins' ServiceAccount that asks with a
// CertificateSigningRequest, as the chart's sidecars do. It returns the plugin and the
// controller settings that sign and trust those certificates.
func (f *fixture) signedPlugin(node string) (*plugin, map[string]string) {
	f.t.Helper()
	ctx := f.Ctx()
	const sa = "node-plugin"
	if _, err := f.Clientset.CoreV1().ServiceAccounts(f.PluginNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	// What the chart gives the node plugins: create and read their requests.
	role := f.Name + "-sidecar-csr"
	if _, err := f.Clientset.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"},
			Verbs: []string{"create", "get"}}},
	}, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.Clientset.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: f.PluginNS, Name: sa}},
	}, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	keyPair := func(ctx context.Context) (string, string, error) {
		// A new pod of the node plugin on node, and the token the kubelet would mount into it.
		pod, err := f.Clientset.CoreV1().Pods(f.PluginNS).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: node + "-"},
			Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa, AutomountServiceAccountToken: new(bool),
				Containers: []corev1.Container{{Name: "healer-sidecar", Image: "healer-sidecar"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			return "", "", err
		}
		tok, err := f.Clientset.CoreV1().ServiceAccounts(f.PluginNS).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		}}, metav1.CreateOptions{})
		if err != nil {
			return "", "", err
		}
		cfg := rest.AnonymousClientConfig(f.s.Config)
		cfg.BearerToken = tok.Status.Token
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return "", "", err
		}
		certs, err := sidecar.NewServingCertificates(sidecar.CertificateRequestOptions{
			Requests:   cs.CertificatesV1().CertificateSigningRequests(),
			NodeName:   node,
			ServerName: signerServerName,
			Dir:        f.t.TempDir(),
			Wait:       time.Minute,
		})
		if err != nil {
			return "", "", err
		}
		if err := certs.Ensure(ctx); err != nil {
			return "", "", err
		}
		return certs.CertFile(), certs.KeyFile(), nil
	}
	p := f.newPluginWith(node, func(o *harness.PluginOptions) {
		o.TLS = &harness.PluginTLS{ServerName: signerServerName, KeyPair: keyPair}
	})
	return p, map[string]string{
		"SIDECAR_TLS_ENABLED":           "true",
		"SIDECAR_TLS_SERVER_NAME":       signerServerName,
		"SIDECAR_TLS_SIGNER_ENABLED":    "true",
		"SIDECAR_TLS_SIGNER_CA_SECRET":  harness.ControllerNamespace + "/" + f.Name + "-sidecar-ca",
		"SIDECAR_TLS_SIGNER_REQUESTERS": "system:serviceaccount:" + f.PluginNS + ":" + sa,
	}
}

// signedHealBound is how long after its registration a restarted sidecar's broken volume may take
// to be healed: the restart sweep fires at once (its debounce is 300ms in the suite) and the heal
// takes milliseconds.
const signedHealBound = 3 * time.Second

// TestRestartedSidecarWithSignedCertificateIsHealedAtOnce: a node plugin whose sidecar serves a
// certificate of the controller's signer restarts three times, each new pod with a new
// certificate; the controller accepts each at its first call, and the restart sweep heals the
// volume the restart broke as soon as the new sidecar has registered.
func TestRestartedSidecarWithSignedCertificateIsHealedAtOnce(t *testing.T) {
	f := newFixture(t, "signed")
	nbd := f.StorageClass("signed-rbd-nbd", "rbd-nbd", nil)
	p, settings := f.signedPlugin("signed-node-1")
	vols := f.newVolumes(p, nbd, "rbd-nbd", "gone", 1)
	f.CreateVolumes(p.volumes, true)
	ctrl := startController(t, "signed", settings)
	p.start()
	f.SweepFinished(p.Node(), time.Minute)

	for restart := 1; restart <= 3; restart++ {
		p.stop()
		vols[0].SetCondition(t, control.Gone, 0)
		p.start()
		registered := time.Now()
		poll.Eventually(t, time.Minute, fmt.Sprintf("restart %d: the volume healed", restart), func() (bool, string) {
			c := vols[0].Condition(t)
			return c == control.Healthy, string(c)
		})
		took := time.Since(registered)
		t.Logf("restart %d: healed %s after the new sidecar registered", restart, took.Round(time.Millisecond))
		if took > signedHealBound {
			t.Errorf("restart %d: the volume was healed %s after the new sidecar registered, want within %s", restart, took.Round(time.Millisecond), signedHealBound)
		}
	}
	// Each new certificate was accepted at the controller's first call: no call failed.
	if n := harness.MetricSum(ctrl.Scrape(), "volume_healer_call_errors_total", nil); n != 0 {
		t.Errorf("%v calls to the sidecars failed (volume_healer_call_errors_total); want none", n)
	}
}
