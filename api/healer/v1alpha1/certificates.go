package healerv1alpha1

import "strings"

// The sidecars' serving certificates, when they ask for them with a CertificateSigningRequest
// (certificates.k8s.io/v1) rather than read them from files: the sidecar of node N asks for a
// certificate with the common name SidecarCommonName(N) and the one DNS name
// SidecarDNSName(N, base), where base is the controller's sidecar.tls.serverName, and the
// controller's signer signs it only for a requester running on node N.
const (
	// SidecarSignerName is the signerName of the sidecars' CertificateSigningRequests.
	SidecarSignerName = "volume-healer.io/sidecar-serving"
	// SidecarCommonNamePrefix starts the common name of a sidecar's certificate; the node's name
	// follows.
	SidecarCommonNamePrefix = "volume-healer-sidecar:"
)

// SidecarCommonName is the common name of the certificate of node's sidecar.
func SidecarCommonName(node string) string { return SidecarCommonNamePrefix + node }

// SidecarNodeFromCommonName returns the node a sidecar certificate's common name names, and
// whether it is one.
func SidecarNodeFromCommonName(cn string) (string, bool) {
	node, ok := strings.CutPrefix(cn, SidecarCommonNamePrefix)
	return node, ok && node != ""
}

// SidecarDNSName is the DNS name the controller dials node's sidecar with (its TLS server name)
// when sidecar.tls.serverName is base: "<node>.<base>".
func SidecarDNSName(node, base string) string { return node + "." + base }
