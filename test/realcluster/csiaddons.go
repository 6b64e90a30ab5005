package realcluster

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/test/harness"
)

var csiAddonsNodes = schema.GroupVersionResource{Group: "csiaddons.openshift.io", Version: "v1alpha1", Resource: "csiaddonsnodes"}

// WaitOneCSIAddonsNode waits until the node plugin's two sidecars keep one CSIAddonsNode of the
// driver on the node, and the controller has swept the restart it shows: the csi-addons
// sidecar's object (named after the node, the namespace and the DaemonSet; its endpoint in
// spec.driver.endpoint), made by the running node plugin pod, carrying the healer sidecar's
// registration of that same pod (its restart marker and its own endpoint), and the restart marker
// of both recorded as handled. It returns the handled marker.
func (e *Env) WaitOneCSIAddonsNode(t harness.TB, timeout time.Duration) string {
	t.Helper()
	client, err := dynamic.NewForConfig(e.c.Config)
	if err != nil {
		t.Fatalf("%v", err)
	}
	want := fmt.Sprintf("%s-%s-daemonset-%s", e.c.NodeName(), driverNS, nodePluginDS)
	var handled string
	harness.Eventually(t, timeout, "one CSIAddonsNode shared by both sidecars of the running node plugin, its restart swept", func() (bool, string) {
		ctx := t.Context()
		pods, err := e.c.Clientset.CoreV1().Pods(driverNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=node-plugin"})
		if err != nil {
			return false, err.Error()
		}
		if len(pods.Items) != 1 || pods.Items[0].DeletionTimestamp != nil {
			return false, fmt.Sprintf("%d node plugin pods, want one that is not going away", len(pods.Items))
		}
		pod := pods.Items[0]
		list, err := client.Resource(csiAddonsNodes).Namespace(driverNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var ours []unstructured.Unstructured
		for _, o := range list.Items {
			name, _, _ := unstructured.NestedString(o.Object, "spec", "driver", "name")
			node, _, _ := unstructured.NestedString(o.Object, "spec", "driver", "nodeID")
			if name == driverName && node == e.c.NodeName() {
				ours = append(ours, o)
			}
		}
		if len(ours) != 1 {
			names := make([]string, 0, len(ours))
			for _, o := range ours {
				names = append(names, o.GetName())
			}
			return false, fmt.Sprintf("%d CSIAddonsNodes of %s on %s: %v", len(ours), driverName, e.c.NodeName(), names)
		}
		o := ours[0]
		a := o.GetAnnotations()
		endpoint, _, _ := unstructured.NestedString(o.Object, "spec", "driver", "endpoint")
		switch {
		case o.GetName() != want:
			return false, fmt.Sprintf("the object is %s, not the csi-addons sidecar's %s", o.GetName(), want)
		case a[annotations.CSIAddonsPod] != string(pod.UID):
			return false, fmt.Sprintf("%s: made by pod %q, the running node plugin pod is %s (%s)", o.GetName(), a[annotations.CSIAddonsPod], pod.Name, pod.UID)
		case !strings.HasPrefix(endpoint, "pod://") || !strings.HasSuffix(endpoint, ":9070"):
			return false, fmt.Sprintf("%s: spec.driver.endpoint %q is not the csi-addons sidecar's", o.GetName(), endpoint)
		case !strings.HasSuffix(a[annotations.HealerRestart], "/"+string(pod.UID)):
			return false, fmt.Sprintf("%s: healer restart marker %q is not of pod %s", o.GetName(), a[annotations.HealerRestart], pod.UID)
		case !strings.HasSuffix(a[annotations.Endpoint], ":9072"):
			return false, fmt.Sprintf("%s: healer endpoint %q", o.GetName(), a[annotations.Endpoint])
		case a[annotations.HandledMarker] == "" || !strings.Contains(a[annotations.HandledMarker], a[annotations.HealerRestart]) ||
			!strings.Contains(a[annotations.HandledMarker], a[annotations.CSIAddonsPod]):
			return false, fmt.Sprintf("%s: handled marker %q, restart marker of %s and %s", o.GetName(), a[annotations.HandledMarker], a[annotations.CSIAddonsPod], a[annotations.HealerRestart])
		}
		handled = a[annotations.HandledMarker]
		return true, ""
	})
	return handled
}
