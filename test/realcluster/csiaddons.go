package realcluster

import (
	"fmt"
	"strings"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/test/controlplane"
	"github.com/volume-healer/volume-healer/test/harness"
)

// WaitOneCSIAddonsNode waits until the node plugin's two sidecars keep one CSIAddonsNode of the
// driver on the node, and the controller has swept the restart it shows: the csi-addons
// sidecar's object (named after the node, the namespace and the DaemonSet; its endpoint in
// spec.driver.endpoint), made by the running node plugin pod, carrying the healer sidecar's
// registration of that same pod (its restart marker and its own endpoint), and the restart marker
// of both recorded as handled. It returns the handled marker.
func (e *Env) WaitOneCSIAddonsNode(t harness.TB, timeout time.Duration) string {
	t.Helper()
	scheme, err := controlplane.NewScheme()
	if err != nil {
		t.Fatalf("%v", err)
	}
	c, err := client.New(e.c.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatalf("%v", err)
	}
	want := fmt.Sprintf("%s-%s-daemonset-%s", e.c.NodeName(), driverNS, nodePluginDS)
	var handled string
	harness.Eventually(t, timeout, "one CSIAddonsNode shared by both sidecars of the running node plugin, its restart swept", func() (bool, string) {
		ctx := t.Context()
		pods, err := e.c.Clientset.CoreV1().Pods(driverNS).List(ctx, metav1.ListOptions{LabelSelector: nodePluginPods})
		if err != nil {
			return false, err.Error()
		}
		if len(pods.Items) != 1 || pods.Items[0].DeletionTimestamp != nil {
			return false, fmt.Sprintf("%d node plugin pods, want one that is not going away", len(pods.Items))
		}
		pod := pods.Items[0]
		var list csiaddonsv1alpha1.CSIAddonsNodeList
		if err := c.List(ctx, &list, client.InNamespace(driverNS)); err != nil {
			return false, err.Error()
		}
		var ours []*csiaddonsv1alpha1.CSIAddonsNode
		var names []string
		for i := range list.Items {
			if d := list.Items[i].Spec.Driver; d.Name == driverName && d.NodeID == e.c.NodeName() {
				ours = append(ours, &list.Items[i])
				names = append(names, list.Items[i].Name)
			}
		}
		if len(ours) != 1 {
			return false, fmt.Sprintf("%d CSIAddonsNodes of %s on %s: %v", len(ours), driverName, e.c.NodeName(), names)
		}
		o := ours[0]
		a := o.Annotations
		endpoint := o.Spec.Driver.EndPoint
		switch {
		case o.Name != want:
			return false, fmt.Sprintf("the object is %s, not the csi-addons sidecar's %s", o.Name, want)
		case a[annotations.CSIAddonsPod] != string(pod.UID):
			return false, fmt.Sprintf("%s: made by pod %q, the running node plugin pod is %s (%s)", o.Name, a[annotations.CSIAddonsPod], pod.Name, pod.UID)
		case !strings.HasPrefix(endpoint, "pod://") || !strings.HasSuffix(endpoint, ":9070"):
			return false, fmt.Sprintf("%s: spec.driver.endpoint %q is not the csi-addons sidecar's", o.Name, endpoint)
		case !strings.HasSuffix(a[annotations.HealerRestart], "/"+string(pod.UID)):
			return false, fmt.Sprintf("%s: healer restart marker %q is not of pod %s", o.Name, a[annotations.HealerRestart], pod.UID)
		case !strings.HasSuffix(a[annotations.Endpoint], ":9072"):
			return false, fmt.Sprintf("%s: healer endpoint %q", o.Name, a[annotations.Endpoint])
		case a[annotations.HandledMarker] == "" || !strings.Contains(a[annotations.HandledMarker], a[annotations.HealerRestart]) ||
			!strings.Contains(a[annotations.HandledMarker], a[annotations.CSIAddonsPod]):
			return false, fmt.Sprintf("%s: handled marker %q, restart marker of %s and %s", o.Name, a[annotations.HandledMarker], a[annotations.CSIAddonsPod], a[annotations.HealerRestart])
		}
		handled = a[annotations.HandledMarker]
		return true, ""
	})
	return handled
}
