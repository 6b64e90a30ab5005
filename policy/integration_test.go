package policy

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/volume-healer/volume-healer/test/controlplane"
)

// TestConfigMapDeliveryAgainstAPIServer runs the ConfigMap source against a real kube-apiserver:
// policies created, updated, broken and fixed change the decisions, and a rejection shows as the
// status annotation and as an Event stored by the apiserver.
func TestConfigMapDeliveryAgainstAPIServer(t *testing.T) {
	env := controlplane.Start(t)
	ctx := context.Background()
	client := env.Clientset
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	t.Cleanup(broadcaster.Shutdown)
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "volume-healer"})

	engine, reg := newTestEngine(t, Options{})
	h := startConfigMapSource(t, client, recorder, engine)
	h.decides("ProbeAfterRestart")

	h.create(policyConfigMap("site-policy", map[string]string{"policy.rego": skipPolicy("FromAPIServerV1")}))
	h.decides("FromAPIServerV1")
	h.status("site-policy", isOK)

	h.update("site-policy", map[string]string{"policy.rego": skipPolicy("FromAPIServerV2")})
	h.decides("FromAPIServerV2")
	good := engine.Revision().ID()
	h.status("site-policy", func(st PolicyStatus) bool { return st.Status == StatusOK && st.Revision == good })

	// Broken with a forbidden built-in: rejected, annotated, an Event in the apiserver.
	h.update("site-policy", map[string]string{"policy.rego": policyText(
		`decision := {"action": "skip", "reason": opa.runtime().env.HOME}`)})
	st := h.status("site-policy", func(st PolicyStatus) bool { return st.Status == StatusRejected })
	if st.Reason != KindForbiddenBuiltin || !strings.Contains(st.Error, "volume-healer/site-policy/policy.rego:3") {
		t.Errorf("status %+v, want the forbidden built-in at volume-healer/site-policy/policy.rego:3", st)
	}
	h.eventually("the PolicyRejected Event is stored", func() (bool, string) {
		events, err := client.CoreV1().Events(testNamespace).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=ConfigMap,involvedObject.name=site-policy,reason=" + ReasonPolicyRejected,
		})
		if err != nil {
			return false, err.Error()
		}
		for _, ev := range events.Items {
			if ev.Type == corev1.EventTypeWarning && strings.Contains(ev.Message, "opa.runtime is not allowed") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events", len(events.Items))
	})
	h.decides("FromAPIServerV2")
	if v := metricValue(t, reg, "volume_healer_policy_load_errors_total", map[string]string{"reason": string(KindForbiddenBuiltin)}); v != 1 {
		t.Errorf("load errors = %v, want 1", v)
	}

	// Fixed: serves, and the status says so again.
	h.update("site-policy", map[string]string{"policy.rego": skipPolicy("FromAPIServerV3")})
	h.decides("FromAPIServerV3")
	h.status("site-policy", isOK)

	h.delete("site-policy")
	h.decides("ProbeAfterRestart")
}

// TestRestartWithABrokenPolicyAgainstAPIServer: a controller replica that starts while the
// configured policy is broken serves the last accepted policy kept in the apiserver, never the
// built-in one.
func TestRestartWithABrokenPolicyAgainstAPIServer(t *testing.T) {
	env := controlplane.Start(t)
	ctx := context.Background()
	client := env.Clientset
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first, _ := newTestEngine(t, Options{})
	h := startConfigMapSource(t, client, nil, first)
	h.create(policyConfigMap("site-policy", map[string]string{"policy.rego": skipPolicy("KeptAcrossRestarts")}))
	h.decides("KeptAcrossRestarts")
	h.eventually("the accepted policy is kept in "+DefaultLastGoodName, func() (bool, string) {
		cm, err := client.CoreV1().ConfigMaps(testNamespace).Get(ctx, DefaultLastGoodName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(cm.Data[lastGoodKey], "KeptAcrossRestarts"), cm.Data[lastGoodKey]
	})
	h.update("site-policy", map[string]string{"policy.rego": policyText(`decision := {"action": "skip", "reason": `)})
	h.status("site-policy", func(st PolicyStatus) bool { return st.Status == StatusRejected })

	restarted, reg := newTestEngine(t, Options{})
	r := startConfigMapSource(t, client, nil, restarted)
	r.decides("KeptAcrossRestarts")
	if v := metricValue(t, reg, "volume_healer_policy_rejected", nil); v != 1 {
		t.Errorf("volume_healer_policy_rejected = %v after the restart, want 1", v)
	}
}
