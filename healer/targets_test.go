package healer

import (
	"errors"
	"testing"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/probe"
)

func addonsNode(name, endpointAnnotation, specEndpoint string) *csiaddonsv1alpha1.CSIAddonsNode {
	n := &csiaddonsv1alpha1.CSIAddonsNode{ObjectMeta: metav1.ObjectMeta{Namespace: "csi", Name: name}}
	if endpointAnnotation != "" {
		n.Annotations = map[string]string{annotations.Endpoint: endpointAnnotation}
	}
	n.Spec.Driver = csiaddonsv1alpha1.CSIAddonsNodeDriver{Name: "rbd", NodeID: "node-a", EndPoint: specEndpoint}
	return n
}

func TestTargetMap(t *testing.T) {
	m := NewTargetMap()
	if _, _, err := m.Target("rbd", "node-a"); !errors.Is(err, probe.ErrNoEndpoint) {
		t.Fatalf("empty map: %v, want ErrNoEndpoint", err)
	}
	// The csi-addons sidecar's object and the healer sidecar's: the annotated one is the target.
	m.Set(addonsNode("csi-addons", "", "pod://plugin.csi:9070"))
	if stale := m.Set(addonsNode("healer", "10.0.0.5:9070", "")); stale != "" {
		t.Errorf("a new object reported stale endpoint %q", stale)
	}
	target, n, err := m.Target("rbd", "node-a")
	if err != nil || target.Endpoint != "10.0.0.5:9070" || n.Name != "healer" {
		t.Fatalf("target = %+v from %v, %v; want the healer sidecar's endpoint", target, n, err)
	}
	// The pod came back with another IP: the old endpoint is reported so its connection can go.
	if stale := m.Set(addonsNode("healer", "10.0.0.9:9070", "")); stale != "10.0.0.5:9070" {
		t.Errorf("stale endpoint = %q, want 10.0.0.5:9070", stale)
	}
	if stale := m.Set(addonsNode("healer", "10.0.0.9:9070", "")); stale != "" {
		t.Errorf("an unchanged endpoint reported stale %q", stale)
	}
	if got := m.Nodes("rbd"); len(got) != 1 || got[0] != "node-a" {
		t.Errorf("nodes of rbd = %v", got)
	}
	if ep := m.Delete(types.NamespacedName{Namespace: "csi", Name: "healer"}); ep != "10.0.0.9:9070" {
		t.Errorf("deleting returned %q, want the endpoint to close", ep)
	}
	if _, _, err := m.Target("rbd", "node-a"); !errors.Is(err, probe.ErrNoEndpoint) {
		t.Errorf("only the csi-addons object left: %v, want ErrNoEndpoint (its pod:// endpoint is not ours)", err)
	}
}
