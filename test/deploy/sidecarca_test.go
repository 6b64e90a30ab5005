package deploy

import (
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestChartSidecarCAFromCertManager renders the chart with the signer's CA from the controller
// (the default), from cert-manager with the chart's self-signed Issuer, and from cert-manager with
// a ClusterIssuer of the site: cert-manager's objects appear only when chosen, its Certificate is
// a CA that writes the very Secret the controller reads, and the controller may create that
// Secret only when it is the one making the CA.
func TestChartSidecarCAFromCertManager(t *testing.T) {
	tool(t, "helm")
	const release, namespace = "volume-healer", "healer-system"
	caSecret := namespace + "/volume-healer-sidecar-ca"
	for _, tc := range []struct {
		name       string
		set        []string
		issuer     map[string]any // the Certificate's issuerRef; nil: no Certificate
		selfSigned bool           // the chart renders the Issuer
	}{
		{name: "the controller's CA (default)"},
		{
			name:       "cert-manager, self-signed",
			set:        []string{"sidecarCA.certManager.enabled=true"},
			issuer:     map[string]any{"kind": "Issuer", "name": "volume-healer-sidecar-ca"},
			selfSigned: true,
		},
		{
			name: "cert-manager, a ClusterIssuer of the site",
			set: []string{"sidecarCA.certManager.enabled=true", "sidecarCA.certManager.issuerRef.kind=ClusterIssuer",
				"sidecarCA.certManager.issuerRef.name=site-ca", "sidecarCA.certManager.issuerRef.group=cert-manager.io"},
			issuer: map[string]any{"kind": "ClusterIssuer", "name": "site-ca", "group": "cert-manager.io"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := helmTemplate(t, release, namespace, nil, tc.set...)
			var certs, issuers []*unstructured.Unstructured
			for _, o := range objs {
				if o.GroupVersionKind().Group != "cert-manager.io" {
					continue
				}
				switch {
				case o.GetKind() == "Certificate":
					certs = append(certs, o)
				case o.GetKind() == "Issuer":
					issuers = append(issuers, o)
				default:
					t.Errorf("unexpected cert-manager object %s %s", o.GetKind(), o.GetName())
				}
			}
			if tc.issuer == nil {
				if len(certs)+len(issuers) > 0 {
					t.Fatalf("cert-manager not chosen, yet the chart renders %d Certificates and %d Issuers: an install would need its CRDs", len(certs), len(issuers))
				}
			} else {
				if len(certs) != 1 {
					t.Fatalf("%d Certificates, want the sidecars' CA alone", len(certs))
				}
				c := certs[0]
				ns, name, _ := strings.Cut(caSecret, "/")
				spec, _, _ := unstructured.NestedMap(c.Object, "spec")
				if c.GetNamespace() != ns || spec["secretName"] != name {
					t.Errorf("the Certificate %s/%s writes the Secret %v; the controller reads %s (config sidecar.tls.signer.caSecret)", c.GetNamespace(), c.GetName(), spec["secretName"], caSecret)
				}
				if spec["isCA"] != true {
					t.Errorf("the Certificate is not a CA (isCA %v): it could not sign the sidecars' certificates", spec["isCA"])
				}
				if usages, _, _ := unstructured.NestedStringSlice(c.Object, "spec", "usages"); !slices.Contains(usages, "cert sign") {
					t.Errorf("the CA's usages %v lack cert sign", usages)
				}
				ref, _, _ := unstructured.NestedMap(c.Object, "spec", "issuerRef")
				if len(ref) != len(tc.issuer) {
					t.Errorf("issuerRef %v, want %v", ref, tc.issuer)
				}
				for k, v := range tc.issuer {
					if ref[k] != v {
						t.Errorf("issuerRef %v, want %v", ref, tc.issuer)
						break
					}
				}
				switch {
				case tc.selfSigned && (len(issuers) != 1 || issuers[0].GetName() != ref["name"] || issuers[0].GetNamespace() != ns):
					t.Errorf("the self-signed Issuer %v the Certificate names is not rendered in %s", ref["name"], ns)
				case tc.selfSigned:
					if _, ok, _ := unstructured.NestedMap(issuers[0].Object, "spec", "selfSigned"); !ok {
						t.Errorf("the chart's Issuer %s is not self-signed", issuers[0].GetName())
					}
				case len(issuers) > 0:
					t.Errorf("with an issuer of the site, the chart still renders the Issuer %s", issuers[0].GetName())
				}
			}

			// The controller reads the Secret, and creates it only when it makes the CA.
			var role rbacv1.Role
			convert(t, find(t, objs, "Role", release+"-sidecar-ca"), &role)
			var get, create bool
			for _, r := range role.Rules {
				if !slices.Contains(r.Resources, "secrets") {
					continue
				}
				get = get || slices.Contains(r.Verbs, "get") && slices.Equal(r.ResourceNames, []string{"volume-healer-sidecar-ca"})
				create = create || slices.Contains(r.Verbs, "create")
			}
			if !get {
				t.Errorf("the controller may not read the CA Secret %s: %+v", caSecret, role.Rules)
			}
			if create != (tc.issuer == nil) {
				t.Errorf("the controller may create Secrets: %v; want %v (only when it makes the CA itself)", create, tc.issuer == nil)
			}
		})
	}
}

// TestChartSidecarCAFromCertManagerRefusals: cert-manager's CA without the signer, or an issuer
// without a name, fails the rendering with a message saying what to set.
func TestChartSidecarCAFromCertManagerRefusals(t *testing.T) {
	helm := tool(t, "helm")
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"sidecarCA.certManager.enabled=true", "config.sidecar.tls.signer.enabled=false"}, "sidecarCA.certManager.enabled needs config.sidecar.tls.signer.enabled"},
		{[]string{"sidecarCA.certManager.enabled=true", "sidecarCA.certManager.issuerRef.kind=ClusterIssuer"}, "sidecarCA.certManager.issuerRef needs a name"},
		{[]string{"sidecarCA.certManager.issuerRef.kind=Vault"}, "/sidecarCA/certManager/issuerRef/kind"},
		{[]string{"sidecarCA.certManager.duration=one year"}, "/sidecarCA/certManager/duration"},
	} {
		args := []string{"template", "volume-healer", chart, "--namespace", "healer-system", "--kube-version", kubeVersion}
		for _, s := range tc.set {
			args = append(args, "--set", s)
		}
		out, err := runErr(repoRoot(t), helm, args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--set %v: %v; want a failure saying %q; output:\n%s", tc.set, err, tc.want, out)
		}
	}
}
