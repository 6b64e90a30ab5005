package deploy

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/policy/webhook"
	"github.com/volume-healer/volume-healer/test/harness"
)

// baseWebhookConfiguration is the ValidatingWebhookConfiguration of deploy/base/webhook.yaml.
const baseWebhookConfiguration = "volume-healer-policy"

// routeWebhook points the base's webhook configuration at a controller process listening on addr
// (127.0.0.1:port), trusting ca: the test cluster has no Service network, so the API server calls
// the process at its address instead of through the Service. Everything else the base sets (the
// rules, the label selector, the failurePolicy, the timeout) stays as it ships.
func routeWebhook(t *testing.T, c *cluster, addr string, ca []byte) {
	t.Helper()
	vwcs := c.env.Clientset.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	vwc, err := vwcs.Get(t.Context(), baseWebhookConfiguration, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the base's webhook configuration: %v", err)
	}
	url := "https://" + addr + webhook.Path
	for i := range vwc.Webhooks {
		vwc.Webhooks[i].ClientConfig.Service = nil
		vwc.Webhooks[i].ClientConfig.URL = &url
		vwc.Webhooks[i].ClientConfig.CABundle = ca
	}
	if _, err := vwcs.Update(t.Context(), vwc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("route the base's webhook to %s: %v", url, err)
	}
}

// TestBaseWebhookRefusesABrokenPolicy installs deploy/base for real, runs the controller with the
// base's configuration file and ServiceAccount, and lets the API server call it through the
// base's webhook configuration: a broken edit of the base's policy ConfigMap is refused with the
// file and line, and not stored; a good one is stored and served; other ConfigMaps are not judged;
// and with no controller answering, the base's failurePolicy (Ignore) lets a change through,
// which the controller then rejects when it loads it.
func TestBaseWebhookRefusesABrokenPolicy(t *testing.T) {
	tool(t, "kustomize")
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	c.apply(t, baseWithout(t), false)
	if t.Failed() {
		t.FailNow()
	}

	caFile, certFile, keyFile := writeCertificates(t, dir)
	kubeconfig := filepath.Join(dir, "controller.kubeconfig")
	writeKubeconfig(t, kubeconfig, c.env.Config, serviceAccountToken(ctx, t, c, controllerNamespace, controllerAccount, nil))
	sidecarToken := filepath.Join(dir, "sidecar-token")
	writeFile(t, sidecarToken, serviceAccountToken(ctx, t, c, controllerNamespace, controllerAccount, []string{"volume-healer-sidecar"}))
	webhookAddr, metricsAddr, healthAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	logPath := filepath.Join(dir, "controller.log")
	stop := startController(t, []string{
		"VOLUME_HEALER_KUBECONFIG=" + kubeconfig,
		"VOLUME_HEALER_METRICS_BIND_ADDRESS=" + metricsAddr,
		"VOLUME_HEALER_HEALTH_BIND_ADDRESS=" + healthAddr,
		"VOLUME_HEALER_WEBHOOK_BIND_ADDRESS=" + webhookAddr,
		"VOLUME_HEALER_WEBHOOK_CERT_FILE=" + certFile,
		"VOLUME_HEALER_WEBHOOK_KEY_FILE=" + keyFile,
		"VOLUME_HEALER_SIDECAR_TLS_CA_FILE=" + caFile,
		"VOLUME_HEALER_SIDECAR_AUTH_TOKEN_FILE=" + sidecarToken,
		"VOLUME_HEALER_SCHEDULE_DEFAULT=",
	}, logPath)
	routeWebhook(t, c, webhookAddr, mustRead(t, caFile))
	// Ready means the informers are synced and the webhook listens.
	waitFor(t, 2*time.Minute, "the controller to be ready", logPath, func() (bool, string) {
		body := get(t, "http://"+healthAddr+"/readyz")
		return string(body) == "ok", string(body)
	})
	status := func() string {
		cm, err := c.env.Clientset.CoreV1().ConfigMaps(controllerNamespace).Get(ctx, "volume-healer-policy", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm.Annotations[annotations.PolicyStatus]
	}
	waitFor(t, time.Minute, "the base's policy to be accepted", logPath, func() (bool, string) {
		return strings.Contains(status(), `"status":"ok"`), status()
	})

	cms := c.env.Clientset.CoreV1().ConfigMaps(controllerNamespace)
	stored := func() *corev1.ConfigMap {
		cm, err := cms.Get(ctx, "volume-healer-policy", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm
	}
	policyOf := func(rego string) *corev1.ConfigMap {
		cm := stored()
		cm.Data = map[string]string{"policy.rego": rego}
		return cm
	}
	broken := "package volumehealer\n\n# A brace short.\ndecision := {\"action\": \"skip\", \"reason\": \"Broken\"\n"
	_, err := cms.Update(ctx, policyOf(broken), metav1.UpdateOptions{})
	for _, want := range []string{
		`admission webhook "policy.volume-healer.io" denied the request`,
		"ConfigMap volume-healer/volume-healer-policy: policy rejected (parse)",
		"volume-healer/volume-healer-policy/policy.rego:5",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("updating the base's policy with a syntax error: %v; want an error with %q", err, want)
		}
	}
	if rego := stored().Data["policy.rego"]; strings.Contains(rego, "Broken") {
		t.Errorf("the refused policy was stored: %q", rego)
	}

	// A second policy ConfigMap is judged with the first: one more decision is a conflict. A dry
	// run is judged too.
	second := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: controllerNamespace, Name: "second-policy", Labels: map[string]string{annotations.PolicyLabel: annotations.PolicyLabelValue}},
		Data:       map[string]string{"policy.rego": "package volumehealer\n\ndecision := {\"action\": \"skip\", \"reason\": \"Second\"}\n"},
	}
	if _, err := cms.Create(ctx, second, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil || !strings.Contains(err.Error(), "policy rejected") {
		t.Errorf("a dry run creating a second decision: %v, want it refused", err)
	}
	// Labelled as for 0.1.0, it is a policy ConfigMap too, sent by the second webhook.
	second.Labels = map[string]string{annotations.Previous(annotations.PolicyLabel): annotations.PolicyLabelValue}
	if _, err := cms.Create(ctx, second, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil ||
		!strings.Contains(err.Error(), `admission webhook "legacy-policy.volume-healer.io" denied the request`) || !strings.Contains(err.Error(), "policy rejected") {
		t.Errorf("a dry run creating a second decision labelled for 0.1.0: %v, want it refused by legacy-policy.volume-healer.io", err)
	}

	// Not the webhook's business: a ConfigMap without the policy label, however broken its Rego.
	draft := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: controllerNamespace, Name: "draft"}, Data: map[string]string{"policy.rego": broken}}
	if _, err := cms.Create(ctx, draft, metav1.CreateOptions{}); err != nil {
		t.Errorf("creating an unlabelled ConfigMap: %v", err)
	}

	// A good change is stored, served, and the controller's status patch passes the webhook.
	before := status()
	if _, err := cms.Update(ctx, policyOf("package volumehealer\n\ndecision := {\"action\": \"skip\", \"reason\": \"Maintenance\"}\n"), metav1.UpdateOptions{}); err != nil {
		t.Fatalf("updating the base's policy with a good one: %v", err)
	}
	waitFor(t, time.Minute, "the new policy to be accepted", logPath, func() (bool, string) {
		now := status()
		return now != before && strings.Contains(now, `"status":"ok"`), now
	})
	scrape := get(t, "http://"+metricsAddr+"/metrics")
	for _, want := range []string{`volume_healer_webhook_reviews_total{result="denied"} 3`, `volume_healer_webhook_reviews_total{result="allowed"}`} {
		if !strings.Contains(string(scrape), want) {
			t.Errorf("the controller's /metrics lacks %s:\n%s", want, grep(scrape, "volume_healer_webhook_reviews_total"))
		}
	}

	// No replica answers: failurePolicy Ignore lets the broken change through, and the controller
	// would reject it when it loads it (docs/policy.md).
	stop()
	if _, err := cms.Update(ctx, policyOf(broken), metav1.UpdateOptions{}); err != nil {
		t.Errorf("with the controller down, the base's failurePolicy refused a policy change: %v", err)
	}
	if rego := stored().Data["policy.rego"]; !strings.Contains(rego, "Broken") {
		t.Errorf("with the controller down, the policy change was not stored: %q", rego)
	}
}

// waitFor waits as harness.WaitFor does, and fails t with the end of the controller's log too.
func waitFor(t *testing.T, timeout time.Duration, what, logPath string, cond func() (bool, string)) {
	t.Helper()
	if err := harness.WaitFor(t.Context(), timeout, what, cond); err != nil {
		t.Fatalf("%v\ncontroller log:\n%s", err, tail(logPath))
	}
}
