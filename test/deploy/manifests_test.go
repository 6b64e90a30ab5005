package deploy

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/volume-healer/volume-healer/config"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/policy/webhook"
)

// fullValues sets every option of the chart away from its default (relative to the module's root).
const fullValues = "test/deploy/testdata/values-full.yaml"

// baseWithout renders deploy/base with the component that leaves out the Prometheus Operator's objects.
func baseWithout(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	return kustomizeWith(t, func(dir string) string {
		// kustomize takes only relative paths.
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
`, rel("deploy", "base"), rel("deploy", "components", "without-prometheus-operator"))
	})
}

// baseWithRemediation renders deploy/base with the component that turns remediation on.
func baseWithRemediation(t *testing.T) []*unstructured.Unstructured {
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
`, rel("deploy", "base"), rel("deploy", "components", "remediation"))
	})
}

// TestManifestsServerSideDryRun sends every rendering of deploy/ to a real kube-apiserver as a
// server-side apply dry run with strict field validation: what kubectl apply --server-side and
// helm install would send.
func TestManifestsServerSideDryRun(t *testing.T) {
	tool(t, "kustomize") // the tools first: skipped in -short mode before a control plane starts
	tool(t, "helm")
	c := startCluster(t)

	// Without the Prometheus Operator nothing of it is rendered, and the rest goes into a cluster
	// that lacks its CRDs.
	plain := baseWithout(t)
	for _, o := range plain {
		if o.GroupVersionKind().Group == "monitoring.coreos.com" {
			t.Errorf("the base without the Prometheus Operator still holds %s %s", o.GetKind(), o.GetName())
		}
	}
	if len(ofKind(plain, "Deployment")) != 1 {
		t.Fatal("the base without the Prometheus Operator lost its Deployment")
	}
	c.apply(t, plain, true)

	c.installCRDs(t)
	renders := map[string][]*unstructured.Unstructured{
		"kustomize deploy/base":                  kustomize(t, "deploy/base"),
		"kustomize deploy/base with remediation": baseWithRemediation(t),
		"kustomize deploy/base with propagation": baseWithPropagation(t),
		"kustomize deploy/examples/ceph-csi-rbd": kustomize(t, "deploy/examples/ceph-csi-rbd"),
		"helm template, default values":          helmTemplate(t, "volume-healer", "volume-healer", nil),
		"helm template, every option":            helmTemplate(t, "storage-healer", "healer-system", []string{fullValues}),
	}
	for name, objs := range renders {
		t.Run(name, func(t *testing.T) {
			if len(objs) < 5 {
				t.Fatalf("only %d objects rendered", len(objs))
			}
			c.apply(t, objs, true)
		})
	}

	// The dry run is strict: a misspelt field fails it, in a built-in kind and in a CRD kind alike.
	t.Run("a misspelt field is rejected", func(t *testing.T) {
		base := renders["kustomize deploy/base"]
		sm := find(t, base, "ServiceMonitor", "volume-healer").DeepCopy()
		endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		endpoints[0].(map[string]any)["honourLabels"] = true
		if err := unstructured.SetNestedSlice(sm.Object, endpoints, "spec", "endpoints"); err != nil {
			t.Fatal(err)
		}
		dep := find(t, base, "Deployment", "volume-healer").DeepCopy()
		if err := unstructured.SetNestedField(dep.Object, int64(2), "spec", "replica"); err != nil {
			t.Fatal(err)
		}
		errs := c.applyErrs(t, []*unstructured.Unstructured{sm, dep}, true)
		if len(errs) != 2 {
			t.Fatalf("want 2 errors, got %v", errs)
		}
		for i, field := range []string{"honourLabels", "replica"} {
			if !strings.Contains(errs[i].Error(), field) {
				t.Errorf("the error does not name the field %s: %v", field, errs[i])
			}
		}
	})
}

// TestManifestsLeastPrivilege applies the RBAC of the base, of the sidecar example and of the chart
// for real, and asks the API server what each ServiceAccount may do: the controller reads no
// Secrets, the sidecar gets Secrets only where its driver's node-stage secrets are, and lists and
// watches neither Secrets nor PersistentVolumes nor VolumeAttachments.
func TestManifestsLeastPrivilege(t *testing.T) {
	tool(t, "kustomize")
	tool(t, "helm")
	c := startCluster(t)
	c.installCRDs(t)
	c.apply(t, kustomize(t, "deploy/base"), false)
	c.apply(t, kustomize(t, "deploy/examples/ceph-csi-rbd"), false)
	c.apply(t, helmTemplate(t, "storage-healer", "healer-system", []string{fullValues}), false)
	// The chart with its default values, in another release: remediation off.
	c.apply(t, helmTemplate(t, "plain-healer", "plain-healer", nil), false)

	ra := func(verb, group, resource, namespace string) authorizationv1.ResourceAttributes {
		return authorizationv1.ResourceAttributes{Verb: verb, Group: group, Resource: resource, Namespace: namespace}
	}
	raNamed := func(verb, group, resource, subresource, namespace, name string) authorizationv1.ResourceAttributes {
		return authorizationv1.ResourceAttributes{Verb: verb, Group: group, Resource: resource, Subresource: subresource, Namespace: namespace, Name: name}
	}
	tests := map[string]struct {
		serviceAccount string
		attrs          authorizationv1.ResourceAttributes
		allowed        bool
	}{
		"controller lists PersistentVolumes":               {"volume-healer/volume-healer", ra("list", "", "persistentvolumes", ""), true},
		"controller watches VolumeAttachments":             {"volume-healer/volume-healer", ra("watch", "storage.k8s.io", "volumeattachments", ""), true},
		"controller patches claims anywhere":               {"volume-healer/volume-healer", ra("patch", "", "persistentvolumeclaims", "shop"), true},
		"controller patches CSIAddonsNodes":                {"volume-healer/volume-healer", ra("patch", "csiaddons.openshift.io", "csiaddonsnodes", "ceph-csi"), true},
		"controller creates Events":                        {"volume-healer/volume-healer", ra("create", "events.k8s.io", "events", "shop"), true},
		"controller renews its Lease":                      {"volume-healer/volume-healer", ra("update", "coordination.k8s.io", "leases", "volume-healer"), true},
		"controller marks policy ConfigMaps":               {"volume-healer/volume-healer", ra("patch", "", "configmaps", "volume-healer"), true},
		"controller keeps the last accepted policy":        {"volume-healer/volume-healer", ra("create", "", "configmaps", "volume-healer"), true},
		"controller requests its own sidecar tokens":       {"volume-healer/volume-healer", raNamed("create", "", "serviceaccounts", "token", "volume-healer", "volume-healer"), true},
		"controller requests no tokens of others":          {"volume-healer/volume-healer", raNamed("create", "", "serviceaccounts", "token", "volume-healer", "default"), false},
		"chart: controller requests its own tokens":        {"healer-system/healer", raNamed("create", "", "serviceaccounts", "token", "healer-system", "healer"), true},
		"controller reads no Secrets in its namespace":     {"volume-healer/volume-healer", ra("get", "", "secrets", "volume-healer"), false},
		"controller lists no Secrets cluster-wide":         {"volume-healer/volume-healer", ra("list", "", "secrets", ""), false},
		"controller reads no node-stage Secrets":           {"volume-healer/volume-healer", ra("get", "", "secrets", "rook-ceph"), false},
		"controller touches no ConfigMaps elsewhere":       {"volume-healer/volume-healer", ra("patch", "", "configmaps", "kube-system"), false},
		"controller deletes no claims":                     {"volume-healer/volume-healer", ra("delete", "", "persistentvolumeclaims", "shop"), false},
		"controller takes no Leases elsewhere":             {"volume-healer/volume-healer", ra("update", "coordination.k8s.io", "leases", "kube-system"), false},
		"sidecar gets PersistentVolumes":                   {"ceph-csi/rbd-csi-nodeplugin", ra("get", "", "persistentvolumes", ""), true},
		"sidecar lists no PersistentVolumes":               {"ceph-csi/rbd-csi-nodeplugin", ra("list", "", "persistentvolumes", ""), false},
		"sidecar watches no PersistentVolumes":             {"ceph-csi/rbd-csi-nodeplugin", ra("watch", "", "persistentvolumes", ""), false},
		"sidecar gets VolumeAttachments":                   {"ceph-csi/rbd-csi-nodeplugin", ra("get", "storage.k8s.io", "volumeattachments", ""), true},
		"sidecar watches no VolumeAttachments":             {"ceph-csi/rbd-csi-nodeplugin", ra("watch", "storage.k8s.io", "volumeattachments", ""), false},
		"chart: sidecar gets VolumeAttachments":            {"csi-rbd/csi-rbd-plugin", ra("get", "storage.k8s.io", "volumeattachments", ""), true},
		"chart: sidecar lists no VolumeAttachments":        {"csi-rbd/csi-rbd-plugin", ra("list", "storage.k8s.io", "volumeattachments", ""), false},
		"chart: sidecar lists no PersistentVolumes":        {"csi-rbd/csi-rbd-plugin", ra("list", "", "persistentvolumes", ""), false},
		"sidecar watches its Node":                         {"ceph-csi/rbd-csi-nodeplugin", ra("watch", "", "nodes", ""), true},
		"chart: sidecar watches its Node":                  {"csi-rbd/csi-rbd-plugin", ra("watch", "", "nodes", ""), true},
		"chart: sidecar updates no Node":                   {"csi-rbd/csi-rbd-plugin", ra("update", "", "nodes", ""), false},
		"sidecar reviews tokens":                           {"ceph-csi/rbd-csi-nodeplugin", ra("create", "authentication.k8s.io", "tokenreviews", ""), true},
		"sidecar registers its CSIAddonsNode":              {"ceph-csi/rbd-csi-nodeplugin", ra("patch", "csiaddons.openshift.io", "csiaddonsnodes", "ceph-csi"), true},
		"sidecar keeps its CSIAddonsNode registered":       {"ceph-csi/rbd-csi-nodeplugin", ra("watch", "csiaddons.openshift.io", "csiaddonsnodes", "ceph-csi"), true},
		"sidecar gets its node-stage Secret":               {"ceph-csi/rbd-csi-nodeplugin", raNamed("get", "", "secrets", "", "rook-ceph", "rook-csi-rbd-node"), true},
		"sidecar gets no other Secret there":               {"ceph-csi/rbd-csi-nodeplugin", raNamed("get", "", "secrets", "", "rook-ceph", "rook-ceph-admin-keyring"), false},
		"sidecar lists no node-stage Secrets":              {"ceph-csi/rbd-csi-nodeplugin", ra("list", "", "secrets", "rook-ceph"), false},
		"sidecar watches no node-stage Secrets":            {"ceph-csi/rbd-csi-nodeplugin", ra("watch", "", "secrets", "rook-ceph"), false},
		"sidecar reads no Secrets of its own namespace":    {"ceph-csi/rbd-csi-nodeplugin", ra("get", "", "secrets", "ceph-csi"), false},
		"sidecar lists no Secrets cluster-wide":            {"ceph-csi/rbd-csi-nodeplugin", ra("list", "", "secrets", ""), false},
		"sidecar writes no Secrets":                        {"ceph-csi/rbd-csi-nodeplugin", ra("update", "", "secrets", "rook-ceph"), false},
		"sidecar touches no CSIAddonsNodes elsewhere":      {"ceph-csi/rbd-csi-nodeplugin", ra("patch", "csiaddons.openshift.io", "csiaddonsnodes", "csi-rbd"), false},
		"sidecar changes no PersistentVolumes":             {"ceph-csi/rbd-csi-nodeplugin", ra("patch", "", "persistentvolumes", ""), false},
		"controller evicts no pods without remediation":    {"volume-healer/volume-healer", ra("create", "", "pods/eviction", "shop"), false},
		"controller lists no pods without remediation":     {"volume-healer/volume-healer", ra("list", "", "pods", "shop"), false},
		"chart: controller evicts pods with remediation":   {"healer-system/healer", ra("create", "", "pods/eviction", "shop"), true},
		"chart: controller lists pods with remediation":    {"healer-system/healer", ra("list", "", "pods", "shop"), true},
		"chart: remediation reads namespaces":              {"healer-system/healer", ra("get", "", "namespaces", ""), true},
		"chart: remediation lists disruption budgets":      {"healer-system/healer", ra("list", "policy", "poddisruptionbudgets", "shop"), true},
		"chart: remediation deletes no pods":               {"healer-system/healer", ra("delete", "", "pods", "shop"), false},
		"chart: remediation reads no pod logs":             {"healer-system/healer", ra("get", "", "pods/log", "shop"), false},
		"chart: remediation changes no disruption budgets": {"healer-system/healer", ra("update", "policy", "poddisruptionbudgets", "shop"), false},
		"base: no namespace watch without propagation":     {"volume-healer/volume-healer", ra("watch", "", "namespaces", ""), false},
		"chart: propagation webhook watches namespaces":    {"healer-system/healer", ra("watch", "", "namespaces", ""), true},
		"chart: propagation changes no namespaces":         {"healer-system/healer", ra("update", "", "namespaces", ""), false},
		"chart defaults: no evictions":                     {"plain-healer/plain-healer-volume-healer", ra("create", "", "pods/eviction", "shop"), false},
		"chart: controller marks policy ConfigMaps":        {"healer-system/healer", ra("patch", "", "configmaps", "healer-policies"), true},
		"chart: controller keeps the last accepted policy": {"healer-system/healer", ra("create", "", "configmaps", "healer-policies"), true},
		"chart: controller renews its Lease":               {"healer-system/healer", ra("update", "coordination.k8s.io", "leases", "healer-system"), true},
		"chart: controller reads no Secrets":               {"healer-system/healer", ra("get", "", "secrets", "healer-system"), false},
		"chart: sidecar gets node-stage Secrets":           {"csi-rbd/csi-rbd-plugin", raNamed("get", "", "secrets", "", "ceph-secrets-archive", "csi-rbd-node-archive"), true},
		"chart: sidecar gets no other Secret there":        {"csi-rbd/csi-rbd-plugin", raNamed("get", "", "secrets", "", "ceph-secrets-archive", "admin-keyring"), false},
		"chart: sidecar watches no node-stage Secrets":     {"csi-rbd/csi-rbd-plugin", ra("watch", "", "secrets", "ceph-secrets-archive"), false},
		"chart: sidecar lists no node-stage Secrets":       {"csi-rbd/csi-rbd-plugin", ra("list", "", "secrets", "ceph-secrets-archive"), false},
		"chart: sidecar reads no Secrets of its own":       {"csi-rbd/csi-rbd-plugin", ra("get", "", "secrets", "csi-rbd"), false},
		"chart: sidecar registers its CSIAddonsNode":       {"csi-rbd/csi-rbd-plugin", ra("create", "csiaddons.openshift.io", "csiaddonsnodes", "csi-rbd"), true},
		"chart: sidecar touches no other CSIAddonsNodes":   {"csi-rbd/csi-rbd-plugin", ra("patch", "csiaddons.openshift.io", "csiaddonsnodes", "ceph-csi"), false},
		"controller watches certificate requests":          {"volume-healer/volume-healer", ra("watch", "certificates.k8s.io", "certificatesigningrequests", ""), true},
		"controller approves for its signer":               {"volume-healer/volume-healer", raNamed("approve", "certificates.k8s.io", "signers", "", "", "volume-healer.io/sidecar-serving"), true},
		"controller signs for its signer":                  {"volume-healer/volume-healer", raNamed("sign", "certificates.k8s.io", "signers", "", "", "volume-healer.io/sidecar-serving"), true},
		"controller approves for no other signer":          {"volume-healer/volume-healer", raNamed("approve", "certificates.k8s.io", "signers", "", "", "kubernetes.io/kube-apiserver-client"), false},
		"controller signs for no other signer":             {"volume-healer/volume-healer", raNamed("sign", "certificates.k8s.io", "signers", "", "", "kubernetes.io/kubelet-serving"), false},
		"controller writes approvals":                      {"volume-healer/volume-healer", raNamed("update", "certificates.k8s.io", "certificatesigningrequests", "approval", "", ""), true},
		"controller deletes no certificate requests":       {"volume-healer/volume-healer", ra("delete", "certificates.k8s.io", "certificatesigningrequests", ""), false},
		"controller reads the requester's pod":             {"volume-healer/volume-healer", ra("get", "", "pods", "ceph-csi"), true},
		"controller reads its CA Secret":                   {"volume-healer/volume-healer", raNamed("get", "", "secrets", "", "volume-healer", "volume-healer-sidecar-ca"), true},
		"controller reads no other Secret there":           {"volume-healer/volume-healer", raNamed("get", "", "secrets", "", "volume-healer", "volume-healer-webhook-tls"), false},
		"controller updates no Secrets":                    {"volume-healer/volume-healer", ra("update", "", "secrets", "volume-healer"), false},
		"chart: controller reads its CA Secret":            {"healer-system/healer", raNamed("get", "", "secrets", "", "healer-system", "storage-healer-volume-healer-sidecar-ca"), true},
		"chart: controller approves for its signer":        {"healer-system/healer", raNamed("approve", "certificates.k8s.io", "signers", "", "", "volume-healer.io/sidecar-serving"), true},
		"sidecar asks for its certificate":                 {"ceph-csi/rbd-csi-nodeplugin", ra("create", "certificates.k8s.io", "certificatesigningrequests", ""), true},
		"sidecar approves no certificate request":          {"ceph-csi/rbd-csi-nodeplugin", raNamed("update", "certificates.k8s.io", "certificatesigningrequests", "approval", "", ""), false},
		"sidecar signs nothing":                            {"ceph-csi/rbd-csi-nodeplugin", raNamed("sign", "certificates.k8s.io", "signers", "", "", "volume-healer.io/sidecar-serving"), false},
		"chart: sidecar asks for its certificate":          {"csi-rbd/csi-rbd-plugin", ra("create", "certificates.k8s.io", "certificatesigningrequests", ""), true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := c.can(t, tc.serviceAccount, tc.attrs); got != tc.allowed {
				t.Errorf("%s may %s %s/%s in %q: %v, want %v", tc.serviceAccount, tc.attrs.Verb, tc.attrs.Group, tc.attrs.Resource, tc.attrs.Namespace, got, tc.allowed)
			}
		})
	}
}

// loadConfig loads a configuration file the way the controller does.
func loadConfig(t *testing.T, data []byte) (*config.Config, error) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("volume-healer", pflag.ContinueOnError)
	config.RegisterFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	return config.Load(fs, func(name string) (string, bool) {
		if name == "VOLUME_HEALER_CONFIG" {
			return file, true
		}
		return "", false
	})
}

// configKeys returns the dotted keys of a configuration document; schedule.storageClasses is one
// key, whatever it holds.
func configKeys(t *testing.T, data []byte) []string {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	var keys []string
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			p := strings.TrimPrefix(prefix+"."+k, ".")
			if sub, ok := v.(map[string]any); ok && p != "schedule.storageClasses" {
				walk(p, sub)
				continue
			}
			keys = append(keys, p)
		}
	}
	walk("", doc)
	sort.Strings(keys)
	return keys
}

// TestConfigEveryKey checks that the base's configuration file and the chart's values carry every
// key of the controller, so that an operator sees and can set each one.
func TestConfigEveryKey(t *testing.T) {
	defaults := config.Default()
	raw, err := defaults.YAML()
	if err != nil {
		t.Fatal(err)
	}
	want := configKeys(t, raw)

	var values struct {
		Config map[string]any `yaml:"config"`
	}
	if err := yaml.Unmarshal(mustRead(t, path(t, chart, "values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	valuesConfig, err := yaml.Marshal(values.Config)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"deploy/base/config.yaml":        mustRead(t, path(t, "deploy", "base", "config.yaml")),
		chart + "/values.yaml (config:)": valuesConfig,
	} {
		if got := configKeys(t, data); !slices.Equal(got, want) {
			t.Errorf("%s has the keys\n%v\nthe controller has\n%v", name, got, want)
		}
	}
}

// controllerSetup is what a rendering gives the controller: its Deployment, the configuration
// file it mounts, and the objects around them.
type controllerSetup struct {
	objs       []*unstructured.Unstructured
	deployment *appsv1.Deployment
	cfg        *config.Config
}

func setupOf(t *testing.T, objs []*unstructured.Unstructured) controllerSetup {
	t.Helper()
	deps := ofKind(objs, "Deployment")
	if len(deps) != 1 {
		t.Fatalf("%d Deployments rendered, want 1", len(deps))
	}
	var dep appsv1.Deployment
	convert(t, deps[0], &dep)
	var cm *corev1.ConfigMap
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name == "config" && v.ConfigMap != nil {
			for _, o := range ofKind(objs, "ConfigMap") {
				if o.GetName() == v.ConfigMap.Name {
					cm = &corev1.ConfigMap{}
					convert(t, o, cm)
				}
			}
		}
	}
	if cm == nil {
		t.Fatal("the Deployment mounts no rendered ConfigMap as its volume config")
	}
	cfg, err := loadConfig(t, []byte(cm.Data["config.yaml"]))
	if err != nil {
		t.Fatalf("the controller rejects its configuration file:\n%v", err)
	}
	// The pod's environment overrides the file, as the controller reads it.
	c := dep.Spec.Template.Spec.Containers[0]
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace" {
			switch e.Name {
			case "VOLUME_HEALER_LEADER_ELECTION_NAMESPACE":
				cfg.LeaderElection.Namespace = dep.Namespace
			case "VOLUME_HEALER_POLICY_NAMESPACE":
				cfg.Policy.Namespace = dep.Namespace
			}
		}
	}
	return controllerSetup{objs: objs, deployment: &dep, cfg: cfg}
}

func convert(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// TestControllerDeployment checks, for each rendering, that the pod gives the controller what its
// configuration file names, and that Service, monitoring, RBAC and policy fit the configuration.
func TestControllerDeployment(t *testing.T) {
	setups := map[string]controllerSetup{
		"kustomize deploy/base":         setupOf(t, kustomize(t, "deploy/base")),
		"helm template, default values": setupOf(t, helmTemplate(t, "volume-healer", "volume-healer", nil)),
		"helm template, every option":   setupOf(t, helmTemplate(t, "storage-healer", "healer-system", []string{fullValues})),
	}
	for name, s := range setups {
		t.Run(name, func(t *testing.T) { checkController(t, s) })
	}

	// The chart with its default values is the base: the controller runs with the same settings.
	base, chartDefaults := setups["kustomize deploy/base"], setups["helm template, default values"]
	if !reflect.DeepEqual(base.cfg, chartDefaults.cfg) {
		t.Errorf("the controller's settings differ between deploy/base and the chart's defaults:\n%+v\n%+v", base.cfg, chartDefaults.cfg)
	}
	kinds := func(objs []*unstructured.Unstructured) []string {
		var out []string
		for _, o := range objs {
			// The chart generates the webhook's certificate; with the base, the operator creates it.
			if o.GetKind() != "Namespace" && !(o.GetKind() == "Secret" && strings.HasSuffix(o.GetName(), "-webhook-tls")) {
				out = append(out, o.GetKind())
			}
		}
		sort.Strings(out)
		return out
	}
	if b, h := kinds(base.objs), kinds(chartDefaults.objs); !slices.Equal(b, h) {
		t.Errorf("deploy/base renders %v, the chart %v", b, h)
	}

	full := setups["helm template, every option"].cfg
	if full.Policy.Namespace != "healer-policies" || full.LeaderElection.Namespace != "healer-system" || full.Budgets.Global != 100 || full.Schedule.StorageClasses["ceph-rbd"] != "0 */2 * * *" {
		t.Errorf("the chart's config values did not reach the configuration file: %+v", full)
	}
}

func checkController(t *testing.T, s controllerSetup) {
	t.Helper()
	cfg, dep := s.cfg, s.deployment
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want the controller alone", len(pod.Containers))
	}
	c := pod.Containers[0]

	if !cfg.LeaderElection.Enabled || dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
		t.Errorf("want two or more replicas with leader election; leader election %v, replicas %v", cfg.LeaderElection.Enabled, dep.Spec.Replicas)
	}
	if cfg.DryRun {
		t.Error("the shipped configuration only pretends to heal (dryRun: true)")
	}

	// Files the configuration names must be in the pod.
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	mountOf := func(file string) (corev1.Volume, bool) {
		for _, m := range c.VolumeMounts {
			if strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
				return volumes[m.Name], true
			}
		}
		return corev1.Volume{}, false
	}
	configArg := ""
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--config="); ok {
			configArg = v
		}
	}
	if v, ok := mountOf(configArg); !ok || v.ConfigMap == nil {
		t.Errorf("--config=%s is not on a ConfigMap volume", configArg)
	}
	if cfg.Sidecar.TLS.Enabled && !cfg.Sidecar.TLS.InsecureSkipVerify {
		if !cfg.Sidecar.TLS.Signer.Enabled || cfg.Sidecar.TLS.CAFile != "" {
			v, ok := mountOf(cfg.Sidecar.TLS.CAFile)
			if !ok || v.ConfigMap == nil && v.Secret == nil {
				t.Errorf("sidecar.tls.caFile %s is not on a ConfigMap or Secret volume", cfg.Sidecar.TLS.CAFile)
			}
		}
		if !cfg.Sidecar.TLS.Signer.Enabled {
			t.Error("sidecar.tls.signer.enabled is false: every node's sidecar certificate would have to be made by hand")
		}
		if cfg.Sidecar.TLS.ServerName == "" {
			t.Error("sidecar.tls.serverName is empty: every sidecar would need a certificate for its pod IP")
		}
	}
	v, ok := mountOf(cfg.Sidecar.Auth.TokenFile)
	switch {
	case !ok || v.Projected == nil || len(v.Projected.Sources) != 1 || v.Projected.Sources[0].ServiceAccountToken == nil:
		t.Errorf("sidecar.auth.tokenFile %s is not a projected ServiceAccount token", cfg.Sidecar.Auth.TokenFile)
	default:
		tok := v.Projected.Sources[0].ServiceAccountToken
		if cfg.Sidecar.Auth.Audience == "" || tok.Audience != cfg.Sidecar.Auth.Audience {
			t.Errorf("the projected token's audience %q is not sidecar.auth.audience %q (or that is empty, and the token would open the API server too)", tok.Audience, cfg.Sidecar.Auth.Audience)
		}
		if filepath.Join(mountPathOf(c, v.Name), tok.Path) != cfg.Sidecar.Auth.TokenFile {
			t.Errorf("the projected token lands at %s, sidecar.auth.tokenFile is %s", filepath.Join(mountPathOf(c, v.Name), tok.Path), cfg.Sidecar.Auth.TokenFile)
		}
	}

	// Ports and probes follow the bind addresses.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if want := portOf(t, cfg.Metrics.BindAddress); ports["metrics"] != want {
		t.Errorf("container port metrics is %d, metrics.bindAddress listens on %d", ports["metrics"], want)
	}
	if want := portOf(t, cfg.Health.BindAddress); ports["health"] != want {
		t.Errorf("container port health is %d, health.bindAddress listens on %d", ports["health"], want)
	}
	for probe, p := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != probe || p.HTTPGet.Port.String() != "health" {
			t.Errorf("no probe of %s on the port health", probe)
		}
	}
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Error("the controller container is not locked down (read-only root, no privilege escalation, no capabilities)")
	}

	// The Service reaches the metrics port (and the webhook's), and the ServiceMonitor scrapes the
	// metrics port and keeps the claims' namespaces.
	selector := labels.SelectorFromSet(dep.Spec.Selector.MatchLabels)
	services := ofKind(s.objs, "Service")
	if len(services) != 1 {
		t.Fatalf("%d Services, want 1", len(services))
	}
	var svc corev1.Service
	convert(t, services[0], &svc)
	svcPorts := map[string]corev1.ServicePort{}
	for _, p := range svc.Spec.Ports {
		svcPorts[p.TargetPort.String()] = p
	}
	wantPorts := 1
	if cfg.Webhook.Enabled {
		wantPorts = 2
	}
	metricsPort, ok := svcPorts["metrics"]
	if !selector.Matches(labels.Set(svc.Spec.Selector)) || len(svc.Spec.Ports) != wantPorts || !ok {
		t.Errorf("the Service does not send its port to the controller's metrics port (and no other but the webhook's): %+v", svc.Spec)
	}
	for _, sm := range ofKind(s.objs, "ServiceMonitor") {
		endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		if len(endpoints) != 1 || endpoints[0].(map[string]any)["port"] != metricsPort.Name || endpoints[0].(map[string]any)["honorLabels"] != true {
			t.Errorf("the ServiceMonitor does not scrape the port %s with honorLabels: %v", metricsPort.Name, endpoints)
		}
	}
	if cfg.Webhook.Enabled {
		checkWebhook(t, s, svc, ports)
	} else if vwcs := ofKind(s.objs, "ValidatingWebhookConfiguration"); len(vwcs) > 0 {
		t.Errorf("the webhook is registered but webhook.enabled is false: no replica would answer")
	}

	// RBAC where the configuration says, and not one Secret.
	var roles []rbacv1.Role
	for _, o := range ofKind(s.objs, "Role") {
		var r rbacv1.Role
		convert(t, o, &r)
		roles = append(roles, r)
	}
	grants := func(ns, group, resource, verb string) bool {
		for _, r := range roles {
			if r.Namespace != ns {
				continue
			}
			for _, rule := range r.Rules {
				if slices.Contains(rule.APIGroups, group) && slices.Contains(rule.Resources, resource) && slices.Contains(rule.Verbs, verb) {
					return true
				}
			}
		}
		return false
	}
	if !grants(cfg.LeaderElection.Namespace, "coordination.k8s.io", "leases", "update") {
		t.Errorf("no Role lets the controller renew its Lease in %s", cfg.LeaderElection.Namespace)
	}
	if !grants(cfg.Policy.Namespace, "", "configmaps", "patch") || !grants(cfg.Policy.Namespace, "", "configmaps", "watch") ||
		!grants(cfg.Policy.Namespace, "", "configmaps", "create") {
		t.Errorf("no Role lets the controller watch and mark the policy ConfigMaps, and keep the last accepted one, in %s", cfg.Policy.Namespace)
	}
	for _, kind := range []string{"Role", "ClusterRole"} {
		for _, o := range ofKind(s.objs, kind) {
			if strings.Contains(o.GetName(), "sidecar") {
				continue
			}
			rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
			for _, r := range rules {
				res, _ := r.(map[string]any)["resources"].([]any)
				if slices.Contains(res, any("secrets")) || slices.Contains(res, any("*")) {
					t.Errorf("%s %s grants the controller %v", kind, o.GetName(), res)
				}
			}
		}
	}

	// The policy ConfigMap is where the controller looks for it.
	sel, err := labels.Parse(cfg.Policy.LabelSelector)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, o := range ofKind(s.objs, "ConfigMap") {
		if o.GetNamespace() == cfg.Policy.Namespace && sel.Matches(labels.Set(o.GetLabels())) {
			found = true
		}
	}
	if !found {
		t.Errorf("no ConfigMap in %s matches policy.labelSelector %s", cfg.Policy.Namespace, cfg.Policy.LabelSelector)
	}
}

// checkWebhook checks the policy webhook's registration against the configuration: the API
// server calls the Service's port that reaches webhook.bindAddress on the webhook's path, for
// creates and updates of the ConfigMaps policy.labelSelector picks in policy.namespace; the
// certificate files are on a Secret volume, and the caBundle (when rendered) signs the certificate
// for the Service's name; no NetworkPolicy shuts the API server out. The default selector also
// selects the ConfigMaps labelled for 0.1.0 (policy.Selectors): one webhook per selector, the
// same but for its name and object selector.
func checkWebhook(t *testing.T, s controllerSetup, svc corev1.Service, containerPorts map[string]int32) {
	t.Helper()
	cfg, dep := s.cfg, s.deployment
	vwcs := ofKind(s.objs, "ValidatingWebhookConfiguration")
	if len(vwcs) != 1 {
		t.Fatalf("%d ValidatingWebhookConfigurations, want 1", len(vwcs))
	}
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	convert(t, vwcs[0], &vwc)
	policySels, err := policy.Selectors(cfg.Policy.LabelSelector)
	if err != nil {
		t.Fatal(err)
	}
	if len(vwc.Webhooks) != len(policySels) {
		t.Fatalf("%d webhooks in %s, want %d, one per selector of policy.labelSelector %s", len(vwc.Webhooks), vwc.Name, len(policySels), cfg.Policy.LabelSelector)
	}
	wh := vwc.Webhooks[0]
	for i, other := range vwc.Webhooks {
		// The ConfigMaps sent are those the controller reads: a policy label, in the policy namespace.
		objSel, err := metav1.LabelSelectorAsSelector(other.ObjectSelector)
		if err != nil || other.ObjectSelector == nil {
			t.Fatalf("webhook %s: objectSelector %v: %v", other.Name, other.ObjectSelector, err)
		}
		if objSel.String() != policySels[i].String() {
			t.Errorf("webhook %s: objectSelector %s, want %s of policy.labelSelector %s: the webhook would judge other ConfigMaps than the controller reads",
				other.Name, objSel, policySels[i], cfg.Policy.LabelSelector)
		}
		if i == 0 {
			continue
		}
		other.Name, other.ObjectSelector = wh.Name, wh.ObjectSelector
		if !reflect.DeepEqual(other, wh) {
			t.Errorf("webhook %s differs from %s in more than its name and object selector", vwc.Webhooks[i].Name, wh.Name)
		}
	}

	if !slices.Equal(wh.AdmissionReviewVersions, []string{"v1"}) {
		t.Errorf("admissionReviewVersions %v: the controller answers v1 alone", wh.AdmissionReviewVersions)
	}
	if wh.SideEffects == nil || *wh.SideEffects != admissionregistrationv1.SideEffectClassNone {
		t.Errorf("sideEffects %v, want None: a dry run must be judged too", wh.SideEffects)
	}
	if wh.FailurePolicy == nil || (*wh.FailurePolicy != admissionregistrationv1.Ignore && *wh.FailurePolicy != admissionregistrationv1.Fail) {
		t.Errorf("failurePolicy %v is not set", wh.FailurePolicy)
	}
	if wh.TimeoutSeconds == nil || *wh.TimeoutSeconds < 1 || *wh.TimeoutSeconds > 10 {
		t.Errorf("timeoutSeconds %v, want from 1 to 10: every policy change waits for it", wh.TimeoutSeconds)
	}
	if len(wh.Rules) != 1 {
		t.Fatalf("%d rules, want 1", len(wh.Rules))
	}
	r := wh.Rules[0]
	ops := slices.Clone(r.Operations)
	slices.Sort(ops)
	if !slices.Equal(r.APIGroups, []string{""}) || !slices.Equal(r.APIVersions, []string{"v1"}) || !slices.Equal(r.Resources, []string{"configmaps"}) ||
		!slices.Equal(ops, []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}) {
		t.Errorf("the rule %+v, want CREATE and UPDATE of v1 configmaps alone", r)
	}

	if wh.NamespaceSelector != nil {
		nsSel, err := metav1.LabelSelectorAsSelector(wh.NamespaceSelector)
		if err != nil || !nsSel.Matches(labels.Set{"kubernetes.io/metadata.name": cfg.Policy.Namespace}) {
			t.Errorf("namespaceSelector %v leaves out the policy namespace %s (%v)", wh.NamespaceSelector, cfg.Policy.Namespace, err)
		}
	}

	// The API server calls the Service, whose port reaches webhook.bindAddress, on the path served.
	ref := wh.ClientConfig.Service
	if ref == nil || ref.Name != svc.Name || ref.Namespace != dep.Namespace || ref.Path == nil || *ref.Path != webhook.Path {
		t.Fatalf("clientConfig %+v, want the Service %s/%s on the path %s", wh.ClientConfig, dep.Namespace, svc.Name, webhook.Path)
	}
	port := int32(443)
	if ref.Port != nil {
		port = *ref.Port
	}
	var target string
	for _, p := range svc.Spec.Ports {
		if p.Port == port {
			target = p.TargetPort.String()
		}
	}
	if target == "" || containerPorts[target] != portOf(t, cfg.Webhook.BindAddress) {
		t.Errorf("the Service's port %d goes to the container port %q (%d), webhook.bindAddress listens on %s", port, target, containerPorts[target], cfg.Webhook.BindAddress)
	}

	// The certificate: on a Secret volume; with a rendered Secret and caBundle, a pair.
	c := dep.Spec.Template.Spec.Containers[0]
	var secretName string
	for _, file := range []string{cfg.Webhook.CertFile, cfg.Webhook.KeyFile} {
		var vol *corev1.Volume
		for _, m := range c.VolumeMounts {
			if filepath.Dir(file) == m.MountPath {
				for i := range dep.Spec.Template.Spec.Volumes {
					if dep.Spec.Template.Spec.Volumes[i].Name == m.Name {
						vol = &dep.Spec.Template.Spec.Volumes[i]
					}
				}
			}
		}
		if vol == nil || vol.Secret == nil {
			t.Errorf("%s is not on a Secret volume", file)
			continue
		}
		secretName = vol.Secret.SecretName
		if len(vol.Secret.Items) > 0 && !slices.ContainsFunc(vol.Secret.Items, func(k corev1.KeyToPath) bool { return k.Path == filepath.Base(file) }) {
			t.Errorf("the Secret volume %s puts no key at %s", vol.Name, file)
		}
	}
	host := svc.Name + "." + svc.Namespace + ".svc"
	var certs []*unstructured.Unstructured
	for _, o := range s.objs {
		// The webhook's serving certificate; the sidecars' CA (isCA, sidecarCA.certManager) is
		// checked in TestChartSidecarCAFromCertManager.
		if isCA, _, _ := unstructured.NestedBool(o.Object, "spec", "isCA"); o.GetKind() == "Certificate" && o.GroupVersionKind().Group == "cert-manager.io" && !isCA {
			certs = append(certs, o)
		}
	}
	switch {
	case len(wh.ClientConfig.CABundle) > 0:
		var secret corev1.Secret
		convert(t, find(t, s.objs, "Secret", secretName), &secret)
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(wh.ClientConfig.CABundle) {
			t.Fatal("the caBundle holds no PEM certificate")
		}
		if _, err := tls.X509KeyPair(secret.Data["tls.crt"], secret.Data["tls.key"]); err != nil {
			t.Errorf("the Secret %s holds no key pair: %v", secretName, err)
		}
		block, _ := pem.Decode(secret.Data["tls.crt"])
		if block == nil {
			t.Fatalf("the Secret %s holds no PEM certificate", secretName)
		}
		leaf, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots}); err != nil {
			t.Errorf("the API server would not trust the webhook's certificate for %s: %v", host, err)
		}
	case len(certs) == 1:
		var spec struct {
			SecretName string   `json:"secretName"`
			DNSNames   []string `json:"dnsNames"`
		}
		raw, _, _ := unstructured.NestedMap(certs[0].Object, "spec")
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &spec); err != nil {
			t.Fatal(err)
		}
		if spec.SecretName != secretName || !slices.Contains(spec.DNSNames, host) {
			t.Errorf("the Certificate makes the Secret %s for %v; the controller mounts %s and is called as %s", spec.SecretName, spec.DNSNames, secretName, host)
		}
		if inject := vwc.Annotations["cert-manager.io/inject-ca-from"]; inject != certs[0].GetNamespace()+"/"+certs[0].GetName() {
			t.Errorf("the webhook configuration takes its caBundle from %q, not from the Certificate %s/%s", inject, certs[0].GetNamespace(), certs[0].GetName())
		}
	default:
		// The base: the operator creates the Secret and fills in the caBundle (docs/operations.md).
		if secretName != "volume-healer-webhook-tls" {
			t.Errorf("the Secret the base mounts is %s, docs/operations.md says volume-healer-webhook-tls", secretName)
		}
	}

	// No NetworkPolicy of the rendering keeps the API server (outside any pod network) from the
	// webhook's port, and one keeps everyone from the controller's other ports but metrics.
	guarded := false
	for _, o := range ofKind(s.objs, "NetworkPolicy") {
		var np networkingv1.NetworkPolicy
		convert(t, o, &np)
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			t.Fatal(err)
		}
		if np.Namespace != dep.Namespace || !sel.Matches(labels.Set(dep.Spec.Template.Labels)) {
			continue
		}
		open := false
		for _, rule := range np.Spec.Ingress {
			portOK := len(rule.Ports) == 0
			for _, p := range rule.Ports {
				portOK = portOK || p.Port == nil || p.Port.IntVal == containerPorts["webhook"] || p.Port.String() == "webhook"
			}
			open = open || portOK && len(rule.From) == 0
		}
		if !open {
			t.Errorf("the NetworkPolicy %s selects the controller and does not admit anyone to the webhook's port", np.Name)
		}
		if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		guarded = true
		for _, rule := range np.Spec.Ingress {
			if len(rule.Ports) == 0 {
				t.Errorf("the NetworkPolicy %s admits %v to every port of the controller", np.Name, rule.From)
			}
			for _, p := range rule.Ports {
				if p.Port == nil || p.EndPort != nil || (p.Port.String() != "webhook" && p.Port.String() != "metrics" &&
					p.Port.IntVal != containerPorts["webhook"] && p.Port.IntVal != containerPorts["metrics"]) {
					t.Errorf("the NetworkPolicy %s opens the controller's port %v; want the webhook's and the metrics' alone", np.Name, p.Port)
				}
			}
		}
	}
	if !guarded {
		t.Error("no NetworkPolicy selects the controller pods: every pod of the cluster may reach every port of the controller")
	}
}

// volumeMountedAt names the volume that c mounts at path, or "".
func volumeMountedAt(c corev1.Container, path string) string {
	for _, m := range c.VolumeMounts {
		if strings.TrimSuffix(m.MountPath, "/") == strings.TrimSuffix(path, "/") {
			return m.Name
		}
	}
	return ""
}

func mountPathOf(c corev1.Container, volume string) string {
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return m.MountPath
		}
	}
	return ""
}

func portOf(t *testing.T, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("bind address %q: %v", addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return int32(n)
}

// TestSidecarComponent checks the sidecar as deploy/sidecar adds it to a node plugin DaemonSet:
// it trusts the base's controller and token audience, it can reach the driver's socket, and the
// NetworkPolicy opens its port to the controller alone.
func TestSidecarComponent(t *testing.T) {
	objs := kustomize(t, "deploy/examples/ceph-csi-rbd")
	base := setupOf(t, kustomize(t, "deploy/base"))

	var ds appsv1.DaemonSet
	convert(t, find(t, objs, "DaemonSet", "csi-rbdplugin"), &ds)
	var sc *corev1.Container
	for i := range ds.Spec.Template.Spec.Containers {
		if ds.Spec.Template.Spec.Containers[i].Name == "healer-sidecar" {
			sc = &ds.Spec.Template.Spec.Containers[i]
		}
	}
	if sc == nil || len(ds.Spec.Template.Spec.Containers) != 3 {
		t.Fatalf("the DaemonSet does not run the healer sidecar beside its two containers: %d containers", len(ds.Spec.Template.Spec.Containers))
	}
	flags := map[string]string{}
	for _, a := range sc.Args {
		k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		flags[k] = v
	}
	if flags["token-audience"] != base.cfg.Sidecar.Auth.Audience {
		t.Errorf("--token-audience=%s, the controller's token is for %s", flags["token-audience"], base.cfg.Sidecar.Auth.Audience)
	}
	controller := "system:serviceaccount:" + base.deployment.Namespace + ":" + base.deployment.Spec.Template.Spec.ServiceAccountName
	if !slices.Contains(strings.Split(flags["allowed-identities"], ","), controller) {
		t.Errorf("--allowed-identities=%s does not admit the controller %s", flags["allowed-identities"], controller)
	}
	if flags["tls-cert-dir"] == "" || flags["tls-cert-file"] != "" || flags["insecure"] == "true" {
		t.Error("the sidecar does not serve TLS with a certificate it asks for (--tls-cert-dir)")
	}
	if flags["tls-server-name"] != base.cfg.Sidecar.TLS.ServerName {
		t.Errorf("--tls-server-name=%s, the controller expects certificates for <node>.%s", flags["tls-server-name"], base.cfg.Sidecar.TLS.ServerName)
	}
	if !base.cfg.Sidecar.TLS.Signer.Enabled {
		t.Error("the sidecar asks for its certificate, and the controller's signer is off")
	}
	// The pod's key is the pod's alone: in memory, not on the node's disk nor in a Secret that
	// every node plugin could read.
	certVolume := volumeMountedAt(*sc, flags["tls-cert-dir"])
	if certVolume == "" {
		t.Errorf("--tls-cert-dir=%s is on no volume of the sidecar", flags["tls-cert-dir"])
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == certVolume && (v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory) {
			t.Errorf("the sidecar's key (%s) is on volume %s, not on an in-memory emptyDir of the pod's own", flags["tls-cert-dir"], v.Name)
		}
	}
	socket := strings.TrimPrefix(flags["driver-endpoint"], "unix://")
	if m := mountPathOf(*sc, "socket-dir"); m == "" || filepath.Dir(socket) != m {
		t.Errorf("--driver-endpoint=%s is not in the driver's socket-dir volume (mounted at %q)", flags["driver-endpoint"], m)
	}
	// kubelet's records of the volumes, for the sidecar's own probes: read-only, and seeing the
	// mounts made after the container started.
	kubelet := volumeMountedAt(*sc, flags["kubelet-dir"])
	for _, m := range sc.VolumeMounts {
		if m.Name == kubelet && (!m.ReadOnly || m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer) {
			t.Errorf("the sidecar mounts kubelet's folder %s as %+v, want read-only with HostToContainer propagation", flags["kubelet-dir"], m)
		}
	}
	if kubelet == "" {
		t.Errorf("--kubelet-dir=%q is on no volume of the sidecar", flags["kubelet-dir"])
	}
	if sc.SecurityContext == nil || sc.SecurityContext.RunAsUser == nil || *sc.SecurityContext.RunAsUser != 0 {
		t.Error("the sidecar does not run as root, to whom kubelet's records belong")
	}
	volumes := map[string]bool{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		volumes[v.Name] = true
	}
	for _, m := range sc.VolumeMounts {
		if !volumes[m.Name] {
			t.Errorf("the sidecar mounts %s, which the DaemonSet does not have", m.Name)
		}
	}
	if ds.Spec.Template.Spec.TerminationGracePeriodSeconds == nil || *ds.Spec.Template.Spec.TerminationGracePeriodSeconds <= 10 {
		t.Error("terminationGracePeriodSeconds must exceed the sidecar's --shutdown-timeout (10s)")
	}
	ports := map[string]int32{}
	for _, p := range sc.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if listen := portOf(t, flags["listen"]); ports["healer"] != listen {
		t.Errorf("container port healer is %d, --listen is %s", ports["healer"], flags["listen"])
	}
	if metrics := portOf(t, flags["metrics-address"]); ports["healer-metrics"] != metrics {
		t.Errorf("container port healer-metrics is %d, --metrics-address is %s", ports["healer-metrics"], flags["metrics-address"])
	}

	var np networkingv1.NetworkPolicy
	convert(t, find(t, objs, "NetworkPolicy", "healer-sidecar"), &np)
	if np.Namespace != ds.Namespace || !labels.SelectorFromSet(np.Spec.PodSelector.MatchLabels).Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("the NetworkPolicy does not select the node plugin pods: %s %v", np.Namespace, np.Spec.PodSelector)
	}
	controllerPod := labels.Set(base.deployment.Spec.Template.Labels)
	otherPod := labels.Set{"app": "curious"}
	reach := func(podLabels labels.Set, nsName string, port int32) bool {
		for _, rule := range np.Spec.Ingress {
			portOK := len(rule.Ports) == 0
			for _, p := range rule.Ports {
				lo, hi := p.Port.IntVal, p.Port.IntVal
				if p.EndPort != nil {
					hi = *p.EndPort
				}
				if (p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP) && lo <= port && port <= hi {
					portOK = true
				}
			}
			if !portOK {
				continue
			}
			if len(rule.From) == 0 {
				return true
			}
			for _, peer := range rule.From {
				nsOK := peer.NamespaceSelector == nil || labels.SelectorFromSet(peer.NamespaceSelector.MatchLabels).Matches(labels.Set{"kubernetes.io/metadata.name": nsName})
				podOK := peer.PodSelector == nil || labels.SelectorFromSet(peer.PodSelector.MatchLabels).Matches(podLabels)
				if nsOK && podOK {
					return true
				}
			}
		}
		return false
	}
	listen := portOf(t, flags["listen"])
	for name, tc := range map[string]struct {
		pod   labels.Set
		ns    string
		port  int32
		reach bool
	}{
		"the controller reaches the sidecar":             {controllerPod, base.deployment.Namespace, listen, true},
		"another pod of its namespace does not":          {otherPod, base.deployment.Namespace, listen, false},
		"a pod with its labels elsewhere does not":       {controllerPod, "default", listen, false},
		"anyone reaches the sidecar's metrics":           {otherPod, "monitoring", ports["healer-metrics"], true},
		"anyone reaches the driver's other ports":        {otherPod, "default", 8080, true},
		"anyone reaches the port just below the sidecar": {otherPod, "default", listen - 1, true},
	} {
		if got := reach(tc.pod, tc.ns, tc.port); got != tc.reach {
			t.Errorf("%s: %v, want %v", name, got, tc.reach)
		}
	}

	pm := find(t, objs, "PodMonitor", "healer-sidecar")
	if pm.GetNamespace() != ds.Namespace {
		t.Errorf("the PodMonitor is in %s, the node plugin in %s", pm.GetNamespace(), ds.Namespace)
	}
	endpoints, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if len(endpoints) != 1 || endpoints[0].(map[string]any)["port"] != "healer-metrics" {
		t.Errorf("the PodMonitor does not scrape the port healer-metrics: %v", endpoints)
	}
	for _, kind := range []string{"RoleBinding", "ClusterRoleBinding"} {
		for _, o := range ofKind(objs, kind) {
			var b rbacv1.RoleBinding
			convert(t, o, &b)
			for _, s := range b.Subjects {
				if s.Name != ds.Spec.Template.Spec.ServiceAccountName || s.Namespace != ds.Namespace {
					t.Errorf("%s %s binds %s/%s, the node plugin runs as %s/%s", kind, o.GetName(), s.Namespace, s.Name, ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName)
				}
			}
		}
	}
}

// TestHelmLint runs helm lint --strict on the chart, with the default values and with every option.
func TestHelmLint(t *testing.T) {
	helm := tool(t, "helm")
	for name, args := range map[string][]string{
		"default values": nil,
		"every option":   {"--values", fullValues, "--namespace", "healer-system"},
	} {
		t.Run(name, func(t *testing.T) {
			out := run(t, repoRoot(t), helm, append([]string{"lint", "--strict", chart}, args...)...)
			if !strings.Contains(string(out), "0 chart(s) failed") {
				t.Errorf("helm lint: %s", out)
			}
		})
	}
}

// TestHelmRequiredValues checks that the chart refuses, with a message naming the value, what
// would install a sidecar setup that cannot work.
func TestHelmRequiredValues(t *testing.T) {
	helm := tool(t, "helm")
	for name, tc := range map[string]struct {
		set  []string
		want string
	}{
		"sidecar without namespace":              {[]string{"sidecar.enabled=true", "sidecar.serviceAccountName=sa", "sidecar.podLabels.app=x"}, "sidecar.namespace is required"},
		"sidecar without ServiceAccount":         {[]string{"sidecar.enabled=true", "sidecar.namespace=csi", "sidecar.podLabels.app=x"}, "sidecar.serviceAccountName is required"},
		"sidecar without pod labels":             {[]string{"sidecar.enabled=true", "sidecar.namespace=csi", "sidecar.serviceAccountName=sa"}, "sidecar.podLabels is required"},
		"existing ServiceAccount unnamed":        {[]string{"serviceAccount.create=false"}, "serviceAccount.name is required"},
		"policy selector not key=value":          {[]string{"config.policy.labelSelector=tier in (gold)"}, "config.policy.labelSelector of the form key=value"},
		"webhook Secret without its CA":          {[]string{"webhook.certificate.source=secret", "webhook.certificate.secretName=mine"}, "webhook.certificate.caBundle is required"},
		"webhook certificate from nowhere":       {[]string{"webhook.certificate.source=vault"}, "at '/webhook/certificate/source': value must be one of 'helm', 'certManager', 'secret'"},
		"webhook key apart from its certificate": {[]string{"config.webhook.keyFile=/etc/keys/tls.key"}, "must be in one folder"},
	} {
		t.Run(name, func(t *testing.T) {
			args := []string{"template", "volume-healer", chart, "--kube-version", kubeVersion}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			_, err := runErr(repoRoot(t), helm, args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("helm template %v: %v, want an error with %q", tc.set, err, tc.want)
			}
		})
	}
}

// TestRemediationComponent: the base alone grants no eviction and leaves remediation off; the
// component turns remediation on in the controller's environment and grants the eviction, and
// the chart does both with config.remediation.enabled.
func TestRemediationComponent(t *testing.T) {
	tool(t, "kustomize")
	tool(t, "helm")
	grants := func(objs []*unstructured.Unstructured, resource, verb string) bool {
		for _, o := range ofKind(objs, "ClusterRole") {
			var role rbacv1.ClusterRole
			convert(t, o, &role)
			for _, r := range role.Rules {
				if slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
					return true
				}
			}
		}
		return false
	}
	enabledByEnv := func(objs []*unstructured.Unstructured) bool {
		var dep appsv1.Deployment
		convert(t, ofKind(objs, "Deployment")[0], &dep)
		for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
			if e.Name == "VOLUME_HEALER_REMEDIATION_ENABLED" {
				return e.Value == "true"
			}
		}
		return false
	}
	tests := map[string]struct {
		objs    []*unstructured.Unstructured
		enabled bool
	}{
		"kustomize deploy/base":                  {kustomize(t, "deploy/base"), false},
		"kustomize deploy/base with remediation": {baseWithRemediation(t), true},
		"helm template, default values":          {helmTemplate(t, "volume-healer", "volume-healer", nil), false},
		"helm template, every option":            {helmTemplate(t, "storage-healer", "healer-system", []string{fullValues}), true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := grants(tc.objs, "pods/eviction", "create"); got != tc.enabled {
				t.Errorf("grants create pods/eviction: %t, want %t", got, tc.enabled)
			}
			if grants(tc.objs, "pods", "delete") {
				t.Error("grants delete on pods: remediation evicts, never deletes")
			}
			enabled := enabledByEnv(tc.objs)
			if !strings.HasPrefix(name, "kustomize") {
				cfg, err := loadConfig(t, []byte(controllerConfig(t, tc.objs)))
				if err != nil {
					t.Fatal(err)
				}
				enabled = cfg.Remediation.Enabled
			}
			if enabled != tc.enabled {
				t.Errorf("remediation enabled: %t, want %t", enabled, tc.enabled)
			}
		})
	}
}

// controllerConfig returns the configuration file the rendering's ConfigMap holds.
func controllerConfig(t *testing.T, objs []*unstructured.Unstructured) string {
	t.Helper()
	for _, o := range ofKind(objs, "ConfigMap") {
		var cm corev1.ConfigMap
		convert(t, o, &cm)
		if data, ok := cm.Data["config.yaml"]; ok {
			return data
		}
	}
	t.Fatal("no ConfigMap with config.yaml rendered")
	return ""
}
