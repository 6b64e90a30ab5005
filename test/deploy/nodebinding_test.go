package deploy

import (
	"context"
	"strings"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
)

// TestNodePluginWritesOnlyItsNodesCSIAddonsNodes installs the sidecar's manifests for real (the
// kustomize component through the ceph-csi-rbd example, and the Helm chart) and writes
// CSIAddonsNodes as the node plugins of two nodes would, each with the projected token of its own
// pod: the plugin of node A registers A's object; the plugin of node B can neither point A's
// object at itself, nor create an object for A, nor move A's object to B, nor delete it where RBAC
// allows deletes; a token bound to no pod is refused; the controller, in its own namespace, still
// marks the objects; the plugin of node A deletes its own object.
func TestNodePluginWritesOnlyItsNodesCSIAddonsNodes(t *testing.T) {
	tool(t, "kustomize")
	tool(t, "helm")
	for name, tc := range map[string]struct {
		objs           func(t *testing.T) []*unstructured.Unstructured
		namespace, sa  string
		controllerUser string
	}{
		"kustomize component": {
			objs:      func(t *testing.T) []*unstructured.Unstructured { return kustomize(t, "deploy/examples/ceph-csi-rbd") },
			namespace: "ceph-csi", sa: "rbd-csi-nodeplugin",
		},
		"helm chart": {
			objs: func(t *testing.T) []*unstructured.Unstructured {
				return helmTemplate(t, "storage-healer", "healer-system", []string{fullValues})
			},
			namespace: "csi-rbd", sa: "csi-rbd-plugin",
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := startCluster(t)
			c.installCRDs(t)
			c.apply(t, tc.objs(t), false)
			if t.Failed() {
				t.FailNow()
			}
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			checkNodeBinding(ctx, t, c, tc.namespace, tc.sa)
		})
	}
}

func checkNodeBinding(ctx context.Context, t *testing.T, c *cluster, ns, sa string) {
	t.Helper()
	cs := c.env.Clientset
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	grantDelete(ctx, t, c, ns, sa)
	// A node plugin's client: the projected token of its pod on node, as kubelet mounts it.
	pluginOf := func(node string) client.Client {
		t.Helper()
		return clientWithToken(t, c, podBoundToken(ctx, t, c, ns, sa, node))
	}
	nodeA, nodeB := pluginOf("node-a"), pluginOf("node-b")
	unbound := clientWithToken(t, c, serviceAccountToken(ctx, t, c, ns, sa, nil))

	addonsNode := func(name, node, endpoint string) *csiaddonsv1alpha1.CSIAddonsNode {
		return &csiaddonsv1alpha1.CSIAddonsNode{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{annotations.Endpoint: endpoint}},
			Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{
				Name: "rbd.csi.ceph.com", NodeID: node, EndPoint: endpoint,
			}},
		}
	}
	// The policy takes effect a moment after it is stored: wait until B's forgery is refused.
	forged := addonsNode("node-a-rbd", "node-a", "10.0.0.2:9072")
	var err error
	deadline := time.Now().Add(time.Minute)
	for {
		err = nodeB.Create(ctx, forged.DeepCopy())
		if err != nil || time.Now().After(deadline) {
			break
		}
		if err := c.env.Client.Delete(ctx, forged.DeepCopy()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	wantDenied(t, "node B's plugin creating node A's CSIAddonsNode", err,
		`CSIAddonsNode `+ns+`/node-a-rbd is for node "node-a"; the node plugin of node "node-b" may only write the CSIAddonsNodes of its own node`)

	if err := nodeA.Create(ctx, addonsNode("node-a-rbd", "node-a", "10.0.0.1:9072")); err != nil {
		t.Fatalf("node A's plugin creating its own CSIAddonsNode: %v", err)
	}
	var stored csiaddonsv1alpha1.CSIAddonsNode
	key := types.NamespacedName{Namespace: ns, Name: "node-a-rbd"}
	if err := c.env.Client.Get(ctx, key, &stored); err != nil {
		t.Fatal(err)
	}
	patch := func(cl client.Client, p string) error {
		return cl.Patch(ctx, stored.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(p)))
	}
	endpointPatch := string(annotations.MergePatch(map[string]string{annotations.Endpoint: "10.0.0.2:9072"}))
	wantDenied(t, "node B's plugin pointing node A's endpoint at itself", patch(nodeB, endpointPatch),
		`the node plugin of node "node-b" may only write the CSIAddonsNodes of its own node`)
	// The CRD makes spec.driver.nodeID immutable and refuses this first; the policy refuses it too
	// where a CSIAddonsNode CRD without that rule is installed.
	if err := patch(nodeB, `{"spec":{"driver":{"nodeID":"node-b","endpoint":"10.0.0.2:9072"}}}`); err == nil {
		t.Error("node B's plugin moved node A's CSIAddonsNode to node B")
	}
	wantDenied(t, "a token bound to no pod", patch(unbound, endpointPatch),
		"wrote with a token that names no node")
	if err := patch(nodeA, string(annotations.MergePatch(map[string]string{annotations.Endpoint: "10.0.0.11:9072"}))); err != nil {
		t.Errorf("node A's plugin updating its own endpoint: %v", err)
	}
	if err := patch(c.env.Client, `{"metadata":{"annotations":{"example.com/mark":"x"}}}`); err != nil {
		t.Errorf("a writer from another namespace (an administrator, the controller): %v", err)
	}
	if err := c.env.Client.Get(ctx, key, &stored); err != nil {
		t.Fatal(err)
	}
	if got := stored.Annotations[annotations.Endpoint]; got != "10.0.0.11:9072" || stored.Spec.Driver.NodeID != "node-a" {
		t.Errorf("node A's CSIAddonsNode names node %q and endpoint %q, want node-a and its own 10.0.0.11:9072", stored.Spec.Driver.NodeID, got)
	}

	// A node plugin that RBAC lets delete CSIAddonsNodes (the reference driver's chart grants it)
	// deletes only its own node's: deleting node A's would drop A's pending restart.
	wantDenied(t, "node B's plugin deleting node A's CSIAddonsNode", deleteAs(ctx, t, nodeB, stored.DeepCopy()),
		`CSIAddonsNode `+ns+`/node-a-rbd is for node "node-a"; the node plugin of node "node-b" may not delete it`)
	wantDenied(t, "a token bound to no pod deleting a CSIAddonsNode", deleteAs(ctx, t, unbound, stored.DeepCopy()),
		"wrote with a token that names no node")
	if err := c.env.Client.Get(ctx, key, &stored); err != nil {
		t.Fatalf("node A's CSIAddonsNode after the refused deletes: %v", err)
	}
	if err := deleteAs(ctx, t, nodeA, stored.DeepCopy()); err != nil {
		t.Errorf("node A's plugin deleting its own CSIAddonsNode: %v", err)
	}
	if err := c.env.Client.Get(ctx, key, &stored); !apierrors.IsNotFound(err) {
		t.Errorf("node A's CSIAddonsNode after its own plugin deleted it: %v, want not found", err)
	}
}

// grantDelete lets the ServiceAccount sa of ns delete CSIAddonsNodes there, as a driver's chart may.
func grantDelete(ctx context.Context, t *testing.T, c *cluster, ns, sa string) {
	t.Helper()
	cs := c.env.Clientset
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "node-plugin-delete-csiaddonsnodes"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{csiaddonsv1alpha1.GroupVersion.Group}, Resources: []string{"csiaddonsnodes"}, Verbs: []string{"delete"}}}}
	if _, err := cs.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}}}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// deleteAs deletes obj with cl, trying again while RBAC has not yet seen grantDelete's binding.
func deleteAs(ctx context.Context, t *testing.T, cl client.Client, obj client.Object) error {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cl.Delete(ctx, obj)
		if err == nil || !strings.Contains(err.Error(), "cannot delete resource") || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// clientWithToken is a client of the test's API server that authenticates with token alone.
func clientWithToken(t *testing.T, c *cluster, token string) client.Client {
	t.Helper()
	cfg := rest.AnonymousClientConfig(c.env.Config)
	cfg.BearerToken = token
	cl, err := client.New(cfg, client.Options{Scheme: c.env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// wantDenied checks that err is the API server's refusal with a message holding want.
func wantDenied(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: %v; want it forbidden with %q", what, err, want)
	}
	if err != nil {
		t.Logf("%s: %v", what, err)
	}
}
