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

// An object written by 0.1.0 (endpoint and restart marker under healer.csiaddons.openshift.io)
// competes by its start as one written now does: here it is the latest start and the target.
func TestTargetMapReadsRegistrationsOfAPreviousRelease(t *testing.T) {
	previous := annotations.Previous
	written := addonsNode("node-a-rbd", "10.0.0.5:9070", "")
	written.Annotations[annotations.HealerRestart] = "2026-12-01T10:00:00Z/pod-1"
	old := addonsNode("node-a-rbd-csiaddons", "", "pod://plugin:9070")
	old.Annotations = map[string]string{
		previous(annotations.Endpoint):      "10.0.0.9:9070",
		previous(annotations.HealerRestart): "2026-12-01T11:00:00Z/pod-2",
		annotations.CSIAddonsPod:            "pod-2",
	}
	for name, order := range map[string][]*csiaddonsv1alpha1.CSIAddonsNode{
		"written now first": {written, old},
		"0.1.0's first":     {old, written},
	} {
		t.Run(name, func(t *testing.T) {
			m := NewTargetMap()
			for _, n := range order {
				m.Set(n.DeepCopy())
			}
			target, n, err := m.Target("rbd", "node-a")
			if err != nil || target.Endpoint != "10.0.0.9:9070" || n.Name != "node-a-rbd-csiaddons" {
				t.Fatalf("target %+v from %v, %v; want the latest start's endpoint 10.0.0.9:9070", target, n, err)
			}
		})
	}
}

// Two objects name one driver and node, both with an endpoint (the healer sidecar registered before
// the csi-addons sidecar created its own, then moved): the controller dials the registration of the
// node plugin's latest start, whatever the order it learned them in, and a deleted Node takes its
// targets with it.
func TestTargetMapPrefersTheFreshestRegistration(t *testing.T) {
	older := addonsNode("node-a-rbd", "10.0.0.5:9070", "")
	older.Annotations[annotations.HealerRestart] = "2026-12-01T10:00:00.000000001Z/pod-1"
	newer := addonsNode("node-a-rbd-csiaddons", "10.0.0.9:9070", "pod://plugin:9070")
	newer.Annotations[annotations.HealerRestart] = "2026-12-01T11:00:00Z/pod-2"
	newer.Annotations[annotations.CSIAddonsPod] = "pod-2"
	for name, order := range map[string][]*csiaddonsv1alpha1.CSIAddonsNode{
		"older first": {older, newer},
		"newer first": {newer, older},
	} {
		t.Run(name, func(t *testing.T) {
			for range 20 { // map order varies between runs of Target
				m := NewTargetMap()
				for _, n := range order {
					m.Set(n.DeepCopy())
				}
				target, n, err := m.Target("rbd", "node-a")
				if err != nil || target.Endpoint != "10.0.0.9:9070" || n.Name != "node-a-rbd-csiaddons" {
					t.Fatalf("target %+v from %v, %v; want the latest start's endpoint 10.0.0.9:9070", target, n.Name, err)
				}
			}
		})
	}

	m := NewTargetMap()
	m.Set(older)
	other := addonsNode("node-b-rbd", "10.0.0.7:9070", "")
	other.Spec.Driver.NodeID = "node-b"
	m.Set(other)
	dropped, endpoints := m.DeleteNode("node-a")
	if len(dropped) != 1 || dropped[0].Name != "node-a-rbd" || len(endpoints) != 1 || endpoints[0] != "10.0.0.5:9070" {
		t.Errorf("DeleteNode(node-a) = %v, %v; want node-a-rbd and its endpoint", dropped, endpoints)
	}
	if _, _, err := m.Target("rbd", "node-a"); !errors.Is(err, probe.ErrNoEndpoint) {
		t.Errorf("a deleted Node still has a target: %v", err)
	}
	if _, _, err := m.Target("rbd", "node-b"); err != nil {
		t.Errorf("another node lost its target: %v", err)
	}
}

// A CSIAddonsNode whose Node is gone is no target, whether it was recorded before the Node cache
// knew (dropped at its next update) or after (never kept); until the Node cache knows, nothing is
// dropped.
func TestTargetMapDropsTargetsOfGoneNodes(t *testing.T) {
	synced := false
	nodes := map[string]bool{"node-b": true}
	m := NewTargetMap()
	m.SetNodeExists(func(node string) bool { return !synced || nodes[node] })
	early := addonsNode("node-a-rbd", "10.0.0.5:9070", "")
	m.Set(early)
	if _, _, err := m.Target("rbd", "node-a"); err != nil {
		t.Fatalf("a target dropped before the Node cache synced: %v", err)
	}

	synced = true
	if _, _, err := m.Target("rbd", "node-a"); !errors.Is(err, ErrNodeGone) || !errors.Is(err, probe.ErrNoEndpoint) {
		t.Errorf("Target on a gone Node: %v, want ErrNodeGone", err)
	}
	updated := early.DeepCopy()
	updated.Annotations[annotations.HealerRestart] = "2026-12-01T12:00:00Z/pod-3"
	if stale := m.Set(updated); stale != "10.0.0.5:9070" {
		t.Errorf("Set of the object of a gone Node returned stale endpoint %q, want its old connection's 10.0.0.5:9070", stale)
	}
	if _, kept := m.Object(types.NamespacedName{Namespace: "csi", Name: "node-a-rbd"}); kept {
		t.Error("an updated CSIAddonsNode of a gone Node is still a target")
	}
	if stale := m.Set(updated); stale != "" {
		t.Errorf("Set of a dropped object returned stale endpoint %q", stale)
	}
	other := addonsNode("node-b-rbd", "10.0.0.7:9070", "")
	other.Spec.Driver.NodeID = "node-b"
	m.Set(other)
	if got := m.Nodes("rbd"); len(got) != 1 || got[0] != "node-b" {
		t.Errorf("Nodes(rbd) = %v, want [node-b]", got)
	}
}
