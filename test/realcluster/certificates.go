package realcluster

import (
	"fmt"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// sidecarSigner is the signerName of the sidecars' certificate requests, as an operator reads it
// in docs/operations.md.
const sidecarSigner = "volume-healer.io/sidecar-serving"

// waitSidecarCertificateIssued waits until the node plugin's healer sidecar has asked for its
// serving certificate and the controller has approved and signed it, and checks that no request
// of the signer was denied: the installation made no certificate outside the cluster. It keeps
// the CA, from the Secret the controller created (the chart's default caSecret), in sidecarCA.
func (e *Env) waitSidecarCertificateIssued() {
	t := e.t
	t.Helper()
	requester := "system:serviceaccount:" + driverNS + ":healer-refdriver-node"
	poll.Eventually(t, 2*time.Minute, "the healer sidecar's certificate request signed", func() (bool, string) {
		list, err := e.c.Clientset.CertificatesV1().CertificateSigningRequests().List(t.Context(), metav1.ListOptions{FieldSelector: "spec.signerName=" + sidecarSigner})
		if err != nil {
			return false, err.Error()
		}
		issued := 0
		for _, csr := range list.Items {
			for _, c := range csr.Status.Conditions {
				if c.Type == certificatesv1.CertificateDenied && c.Status == corev1.ConditionTrue {
					t.Fatalf("certificate request %s of %s was denied: %s", csr.Name, csr.Spec.Username, c.Message)
				}
			}
			if csr.Spec.Username == requester && len(csr.Status.Certificate) > 0 {
				issued++
			}
		}
		return issued > 0, fmt.Sprintf("%d requests of %s, none signed for %s", len(list.Items), sidecarSigner, requester)
	})
	secret, err := e.c.Clientset.CoreV1().Secrets(healerNS).Get(t.Context(), sidecarCASecret, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the sidecars' CA Secret the controller creates: %v", err)
	}
	e.sidecarCA = secret.Data["ca.crt"]
}

// sidecarCASecret is the CA Secret of the volume-healer release, by the chart's default
// config.sidecar.tls.signer.caSecret.
const sidecarCASecret = "volume-healer-sidecar-ca"
