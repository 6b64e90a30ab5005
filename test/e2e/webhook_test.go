package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/policy/webhook"
	"github.com/volume-healer/volume-healer/test/controlplane"
	"github.com/volume-healer/volume-healer/test/harness"
)

// webhookName names the webhook in the API server's denials, as deploy/ registers it.
const webhookName = "policy.volume-healer.io"

// TestKubectlApplyOfABrokenPolicyFails runs the controller with its policy webhook on a loopback
// port, registers it with the API server as deploy/ does (a URL and a caBundle in place of the
// Service), and applies policy ConfigMaps with kubectl as an operator would: a broken one makes
// `kubectl apply` fail with the controller's located message and is not stored, the serving
// policy stays; a good one is applied and served; a ConfigMap without the policy label is stored
// whatever it holds, and the controller leaves it alone.
func TestKubectlApplyOfABrokenPolicyFails(t *testing.T) {
	f := newFixture(t, "webhook")
	kubectl := kubectlPath(t)
	dir := t.TempDir()
	certPEM, keyPEM, err := harness.SelfSigned("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for file, data := range map[string][]byte{certFile: certPEM, keyFile: keyPEM} {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}

	f.setPolicy("site-policy", builtinPolicy)
	c := f.startController("webhook", map[string]string{
		"WEBHOOK_ENABLED":      "true",
		"WEBHOOK_BIND_ADDRESS": addr,
		"WEBHOOK_CERT_FILE":    certFile,
		"WEBHOOK_KEY_FILE":     keyFile,
	})
	good := f.waitPolicyStatus("site-policy", policy.StatusOK, nil)
	f.registerWebhook("https://"+addr+webhook.Path, certPEM)

	// kubectl apply -f, with the suite's kubeconfig.
	apply := func(name, manifest string) (string, error) {
		t.Helper()
		file := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(file, []byte(manifest), 0o600); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		cmd := exec.Command(kubectl, "--kubeconfig", f.s.Kubeconfig, "apply", "-f", file)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	manifest := func(name string, labelled bool, rego string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\n  namespace: %s\n", name, f.policyNS)
		if labelled {
			fmt.Fprintf(&b, "  labels:\n    %s: %s\n", policyLabel, policyLabelValue)
		}
		b.WriteString("data:\n  policy.rego: |\n")
		for _, line := range strings.Split(strings.TrimSuffix(rego, "\n"), "\n") {
			b.WriteString("    " + line + "\n")
		}
		return b.String()
	}
	deniedBefore := c.Metric("volume_healer_webhook_reviews_total", map[string]string{"result": webhook.ResultDenied})

	// A syntax error in the serving policy: refused, with file and line; nothing changes.
	syntaxError := "package volumehealer\n\n# A brace short.\ndecision := {\"action\": \"skip\", \"reason\": \"Broken\"\n"
	out, err := apply("site-policy-broken", manifest("site-policy", true, syntaxError))
	wantDenied(t, out, err, "ConfigMap "+f.policyNS+"/site-policy: policy rejected (parse) in "+f.policyNS+"/site-policy/policy.rego",
		f.policyNS+"/site-policy/policy.rego:5", "rego_parse_error")
	cm, err := f.Clientset.CoreV1().ConfigMaps(f.policyNS).Get(f.Ctx(), "site-policy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data["policy.rego"] != builtinPolicy {
		t.Errorf("the refused policy was stored:\n%s", cm.Data["policy.rego"])
	}

	// A second ConfigMap whose policy fails on a canned input at run time: refused too.
	runtimeError := "package volumehealer\n\ndecision := {\"action\": \"skip\", \"reason\": sprintf(\"%v\", [to_number(input.volume.pv)])}\n"
	out, err = apply("extra-policy", manifest("extra-policy", true, runtimeError))
	wantDenied(t, out, err, "ConfigMap "+f.policyNS+"/extra-policy: policy rejected (runtime) in "+f.policyNS+"/extra-policy/policy.rego",
		f.policyNS+"/extra-policy/policy.rego:3")

	// No policy label: not the webhook's business, nor the controller's.
	if out, err := apply("notes", manifest("notes", false, syntaxError)); err != nil {
		t.Errorf("kubectl apply of a ConfigMap without the policy label failed: %v\n%s", err, out)
	}

	// A good policy: applied, and served.
	if out, err := apply("site-policy-good", manifest("site-policy", true, goldPolicy)); err != nil {
		t.Fatalf("kubectl apply of a good policy failed: %v\n%s", err, out)
	}
	served := f.waitPolicyStatus("site-policy", policy.StatusOK, func(st policy.PolicyStatus) bool { return st.Revision != good.Revision })
	harness.Eventually(t, 30*time.Second, "the controller to serve revision "+served.Revision, func() (bool, string) {
		v := c.Metric("volume_healer_policy_revision_info", map[string]string{"revision": served.Revision})
		return v == 1, fmt.Sprintf("volume_healer_policy_revision_info{revision=%q} = %v", served.Revision, v)
	})
	notes, err := f.Clientset.CoreV1().ConfigMaps(f.policyNS).Get(f.Ctx(), "notes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st, ok := notes.Annotations[annotations.PolicyStatus]; ok {
		t.Errorf("the controller wrote a policy status on the unlabelled ConfigMap: %s", st)
	}
	if _, err := f.Clientset.CoreV1().ConfigMaps(f.policyNS).Get(f.Ctx(), "extra-policy", metav1.GetOptions{}); err == nil {
		t.Error("the refused ConfigMap extra-policy was stored")
	}
	if denied := c.Metric("volume_healer_webhook_reviews_total", map[string]string{"result": webhook.ResultDenied}); denied < deniedBefore+2 {
		t.Errorf("volume_healer_webhook_reviews_total{result=denied} went from %v to %v over two refusals", deniedBefore, denied)
	}
	if v := c.Metric("volume_healer_policy_load_errors_total", nil); v != 0 {
		t.Errorf("volume_healer_policy_load_errors_total = %v: a refused policy reached the controller", v)
	}
	c.MustRun()
}

// registerWebhook registers the controller's policy webhook at url for the fixture's policy
// namespace, as deploy/ does but for the URL, and waits until the API server calls it. It is
// removed when the test ends.
func (f *fixture) registerWebhook(url string, caBundle []byte) {
	f.t.Helper()
	ignore, none, timeout := admissionregistrationv1.Ignore, admissionregistrationv1.SideEffectClassNone, int32(5)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: f.Name + "-policy"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    webhookName,
			AdmissionReviewVersions: []string{"v1"},
			SideEffects:             &none,
			FailurePolicy:           &ignore,
			TimeoutSeconds:          &timeout,
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": f.policyNS}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{policyLabel: policyLabelValue}},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caBundle},
		}},
	}
	vwcs := f.Clientset.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if _, err := vwcs.Create(f.Ctx(), vwc, metav1.CreateOptions{}); err != nil {
		f.t.Fatalf("register the policy webhook: %v", err)
	}
	f.t.Cleanup(func() {
		// The test's context has ended by now.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := vwcs.Delete(ctx, vwc.Name, metav1.DeleteOptions{}); err != nil {
			f.t.Errorf("remove the policy webhook: %v", err)
		}
	})
	// The API server picks up a new webhook configuration from its own cache: until then a broken
	// policy would pass unchecked. A dry run stores nothing.
	probe := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.policyNS, Name: "webhook-probe", Labels: map[string]string{policyLabel: policyLabelValue}},
		Data:       map[string]string{"policy.rego": "package volumehealer\n\ndecision := \n"},
	}
	harness.Eventually(f.t, 30*time.Second, "the API server to call the policy webhook", func() (bool, string) {
		_, err := f.Clientset.CoreV1().ConfigMaps(f.policyNS).Create(f.Ctx(), probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), webhookName), fmt.Sprint(err)
	})
}

// wantDenied fails t unless kubectl failed with the webhook's denial holding every part of want.
func wantDenied(t *testing.T, out string, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("kubectl apply of a broken policy succeeded:\n%s", out)
		return
	}
	t.Logf("kubectl apply: %v\n%s", err, out)
	want = append([]string{fmt.Sprintf("admission webhook %q denied the request", webhookName)}, want...)
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("kubectl apply failed (%v) without %q in its output:\n%s", err, w, out)
		}
	}
}

// kubectlPath returns the kubectl on the PATH, or the one hack/tools.sh builds (several minutes
// once per machine).
func kubectlPath(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("kubectl"); err == nil {
		return p
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command("bash", filepath.Join(root, "hack", "tools.sh"), "kubectl")
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("no kubectl on the PATH, and hack/tools.sh kubectl failed: %v\n%s", err, errOut.String())
	}
	return strings.TrimSpace(out.String())
}
