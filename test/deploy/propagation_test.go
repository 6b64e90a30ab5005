package deploy

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// baseWithPropagation renders deploy/base with the component that turns the mount propagation
// webhook on.
func baseWithPropagation(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	return kustomizeWith(t, func(dir string) string {
		rel := func(elem ...string) string {
			r, err := filepath.Rel(dir, path(t, elem...))
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		return fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
components:
  - %s
`, rel("deploy", "base"), rel("deploy", "components", "propagation-webhook"))
	})
}

// TestPropagationWebhookComponent: the base and the chart's defaults register no mutating webhook,
// grant nothing on namespaces and leave the webhook off; the component and the chart's value turn
// it on in the controller and register it as designed: pod CREATE only, no side effects, failure
// ignored, asked once, never for kube-system or the controller's own namespace, at the path the
// controller serves; and grant only reading namespaces.
func TestPropagationWebhookComponent(t *testing.T) {
	tool(t, "kustomize")
	tool(t, "helm")
	tests := map[string]struct {
		objs       []*unstructured.Unstructured
		enabled    bool
		controller string // the controller's namespace
		exclude    []string
		timeout    int32
	}{
		"kustomize deploy/base":                          {objs: kustomize(t, "deploy/base")},
		"kustomize deploy/base with propagation webhook": {objs: baseWithPropagation(t), enabled: true, controller: "volume-healer", exclude: []string{"kube-system", "volume-healer"}, timeout: 3},
		"helm template, default values":                  {objs: helmTemplate(t, "volume-healer", "volume-healer", nil)},
		"helm template, every option": {objs: helmTemplate(t, "storage-healer", "healer-system", []string{fullValues}), enabled: true,
			controller: "healer-system", exclude: []string{"kube-system", "healer-system", "monitoring"}, timeout: 2},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			setup := setupOf(t, tc.objs)
			enabled := setup.cfg.PropagationWebhook.Enabled
			for _, e := range setup.deployment.Spec.Template.Spec.Containers[0].Env {
				if e.Name == "VOLUME_HEALER_PROPAGATION_WEBHOOK_ENABLED" {
					enabled = e.Value == "true"
				}
			}
			if enabled != tc.enabled {
				t.Errorf("propagation webhook enabled in the controller: %t, want %t", enabled, tc.enabled)
			}
			if enabled && !setup.cfg.Webhook.Enabled {
				t.Error("the propagation webhook is on but the webhook server it is served by is off")
			}
			namespaceRules := 0
			for _, o := range ofKind(tc.objs, "ClusterRole") {
				var role rbacv1.ClusterRole
				convert(t, o, &role)
				for _, r := range role.Rules {
					if slices.Contains(r.Resources, "namespaces") && slices.ContainsFunc(r.Verbs, func(v string) bool { return v == "list" || v == "watch" }) {
						namespaceRules++
						if !slices.Equal(r.Verbs, []string{"get", "list", "watch"}) || len(r.Resources) != 1 {
							t.Errorf("ClusterRole %s grants %v on %v, want get, list, watch on namespaces alone", role.Name, r.Verbs, r.Resources)
						}
					}
				}
			}
			if (namespaceRules > 0) != tc.enabled {
				t.Errorf("rules that list and watch namespaces: %d, want them only with the webhook on (%t)", namespaceRules, tc.enabled)
			}

			mwcs := ofKind(tc.objs, "MutatingWebhookConfiguration")
			if !tc.enabled {
				if len(mwcs) != 0 {
					t.Fatalf("%d MutatingWebhookConfigurations rendered with the webhook off", len(mwcs))
				}
				return
			}
			if len(mwcs) != 1 {
				t.Fatalf("%d MutatingWebhookConfigurations rendered, want 1", len(mwcs))
			}
			var mwc admissionregistrationv1.MutatingWebhookConfiguration
			convert(t, mwcs[0], &mwc)
			if len(mwc.Webhooks) != 1 {
				t.Fatalf("%d webhooks, want 1", len(mwc.Webhooks))
			}
			w := mwc.Webhooks[0]
			if w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Ignore {
				t.Errorf("failurePolicy %v, want Ignore: a pod creation must never wait on the controller", w.FailurePolicy)
			}
			if w.SideEffects == nil || *w.SideEffects != admissionregistrationv1.SideEffectClassNone {
				t.Errorf("sideEffects %v, want None", w.SideEffects)
			}
			if w.ReinvocationPolicy == nil || *w.ReinvocationPolicy != admissionregistrationv1.NeverReinvocationPolicy {
				t.Errorf("reinvocationPolicy %v, want Never", w.ReinvocationPolicy)
			}
			if w.TimeoutSeconds == nil || *w.TimeoutSeconds != tc.timeout {
				t.Errorf("timeoutSeconds %v, want %d", w.TimeoutSeconds, tc.timeout)
			}
			if len(w.Rules) != 1 || !slices.Equal(w.Rules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}) ||
				!slices.Equal(w.Rules[0].Resources, []string{"pods"}) || !slices.Equal(w.Rules[0].APIGroups, []string{""}) {
				t.Errorf("rules %+v, want pod CREATE only", w.Rules)
			}
			sel := w.NamespaceSelector
			if sel == nil || len(sel.MatchLabels) != 0 || len(sel.MatchExpressions) != 1 || sel.MatchExpressions[0].Key != "kubernetes.io/metadata.name" ||
				sel.MatchExpressions[0].Operator != "NotIn" || !sameSet(sel.MatchExpressions[0].Values, tc.exclude) {
				t.Errorf("namespaceSelector %+v, want every namespace but %v", sel, tc.exclude)
			}
			svc := w.ClientConfig.Service
			if svc == nil || svc.Path == nil || *svc.Path != "/mutate-pod-propagation" || svc.Namespace != tc.controller {
				t.Errorf("clientConfig.service %+v, want the controller's Service at /mutate-pod-propagation", svc)
			}
			// The Service's port reaches the container's webhook port, which the policy webhook's
			// server listens on.
			var dep appsv1.Deployment = *setup.deployment
			if !slices.ContainsFunc(dep.Spec.Template.Spec.Containers[0].Ports, func(p corev1.ContainerPort) bool { return p.Name == "webhook" }) {
				t.Error("the controller's container has no port webhook")
			}
		})
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
