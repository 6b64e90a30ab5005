package deploy

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/volume-healer/volume-healer/test/controlplane"
)

// fieldManager owns what the tests apply.
const fieldManager = "volume-healer-deploy-test"

// cluster is a real control plane that takes rendered manifests.
type cluster struct {
	env    *controlplane.Env
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

// startCluster starts a control plane (with the CSIAddonsNode CRD) for t.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	env := controlplane.Start(t)
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{env: env, dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
}

// installCRDs installs the test's stand-ins for the CRDs of the Prometheus Operator and of
// cert-manager and waits until they serve.
func (c *cluster) installCRDs(t *testing.T) {
	t.Helper()
	if _, err := envtest.InstallCRDs(c.env.Config, envtest.CRDInstallOptions{
		Paths: []string{
			path(t, "test", "deploy", "testdata", "monitoring-crds.yaml"),
			path(t, "test", "deploy", "testdata", "cert-manager-crds.yaml"),
		},
		ErrorIfPathMissing: true,
	}); err != nil {
		t.Fatalf("install the stand-in CRDs: %v", err)
	}
	c.mapper.Reset()
}

// apply sends objs with server-side apply and strict field validation, so that an unknown or
// duplicate field is an error, as kubectl apply --server-side would. With dryRun the API server
// admits and validates each object without storing it; Namespaces, and the namespaces the objects
// name, are created for real since nothing can be admitted into a namespace that does not exist.
// Every failure is reported, not only the first.
func (c *cluster) apply(t *testing.T, objs []*unstructured.Unstructured, dryRun bool) {
	t.Helper()
	for _, err := range c.applyErrs(t, objs, dryRun) {
		t.Error(err)
	}
}

func (c *cluster) applyErrs(t *testing.T, objs []*unstructured.Unstructured, dryRun bool) []error {
	t.Helper()
	ctx := t.Context()
	var errs []error
	var rest []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Namespace" && o.GroupVersionKind().Group == "" {
			if err := c.applyOne(t, o, false); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		rest = append(rest, o)
	}
	for _, o := range rest {
		if ns := o.GetNamespace(); ns != "" {
			_, err := c.env.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				errs = append(errs, fmt.Errorf("namespace %s: %w", ns, err))
			}
		}
	}
	for _, o := range rest {
		if err := c.applyOne(t, o, dryRun); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func (c *cluster) applyOne(t *testing.T, o *unstructured.Unstructured, dryRun bool) error {
	t.Helper()
	gvk := o.GroupVersionKind()
	id := fmt.Sprintf("%s %s/%s", gvk.Kind, o.GetNamespace(), o.GetName())
	mapping, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("%s: %w", id, err)
	}
	var ri dynamic.ResourceInterface = c.dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		if o.GetNamespace() == "" {
			// kubectl would put it into whatever namespace its context names.
			return fmt.Errorf("%s: a namespaced object without a namespace", id)
		}
		ri = c.dyn.Resource(mapping.Resource).Namespace(o.GetNamespace())
	}
	data, err := json.Marshal(o.Object)
	if err != nil {
		return err
	}
	force := true
	opts := metav1.PatchOptions{FieldManager: fieldManager, Force: &force, FieldValidation: metav1.FieldValidationStrict}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	if _, err := ri.Patch(t.Context(), o.GetName(), types.ApplyPatchType, data, opts); err != nil {
		return fmt.Errorf("%s: %w", id, err)
	}
	return nil
}

// can asks the API server whether the ServiceAccount namespace/name may do verb on resource.
func (c *cluster) can(t *testing.T, serviceAccount string, attrs authorizationv1.ResourceAttributes) bool {
	t.Helper()
	ns, _, _ := strings.Cut(serviceAccount, "/")
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               "system:serviceaccount:" + strings.Replace(serviceAccount, "/", ":", 1),
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		ResourceAttributes: &attrs,
	}}
	got, err := c.env.Clientset.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got.Status.Allowed
}
