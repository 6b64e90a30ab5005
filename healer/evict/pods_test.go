package evict

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// createdAt is pod with the creation time the API server would give it: whole seconds.
func createdAt(p *corev1.Pod, at time.Time) *corev1.Pod {
	p.CreationTimestamp = metav1.NewTime(at.Truncate(time.Second))
	return p
}

// A pod created in the same second as the heal, before it, mounted the volume before the heal:
// creation times are whole seconds, and nothing evicted a pod of the volume on the node that it
// could replace, so it is evicted. Pods created in a later second are left alone.
func TestPodCreatedInTheHealsSecondIsEvicted(t *testing.T) {
	heal := t0.Add(700 * time.Millisecond)
	l := newLadder(t, true, nil,
		createdAt(pod("web-1", "node-a", "data", "ReplicaSet"), t0.Add(200*time.Millisecond)),
		createdAt(pod("web-2", "node-a", "data", "ReplicaSet"), t0.Add(1200*time.Millisecond)))
	req := healRequest(heal)
	l.e.Add(req)
	retry, _, cleared := l.e.process(context.Background(), req)
	if retry || !cleared {
		t.Fatalf("process = retry %t, cleared %t; want the pod evicted at once", retry, cleared)
	}
	if got := l.evictedPods(); got != "web-1" {
		t.Errorf("evicted %q, want web-1 (created in the heal's second, before it), not web-2 (created a second later)", got)
	}
}

// Once the evictor evicted a pod of the volume on the node, a pod created in the heal's second
// may be that pod's replacement, which got the repaired mount: it is left alone, and so is one
// created after the eviction in a later request's second.
func TestPodCreatedInTheHealsSecondAfterAnEvictionIsLeftAlone(t *testing.T) {
	heal := t0.Add(100 * time.Millisecond)
	old := pod("web-1", "node-a", "data", "ReplicaSet")
	l := newLadder(t, true, nil, old)
	req := healRequest(heal)
	l.e.Add(req)
	if _, _, cleared := l.e.process(context.Background(), req); !cleared || l.evictedPods() != "web-1" {
		t.Fatalf("cleared %t, evicted %q; want web-1 evicted", cleared, l.evictedPods())
	}
	// The ReplicaSet replaced it within the same second; a request for the same heal (a retry,
	// or a second report of the dead mount in that second) comes.
	if err := l.cs.CoreV1().Pods("shop").Delete(context.Background(), old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	replacement := createdAt(pod("web-1-new", "node-a", "data", "ReplicaSet"), heal.Add(300*time.Millisecond))
	replacement.UID = types.UID("uid-web-1-new")
	if _, err := l.cs.CoreV1().Pods("shop").Create(context.Background(), replacement, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	again := healRequest(heal.Add(500 * time.Millisecond))
	l.e.Add(again)
	if _, _, cleared := l.e.process(context.Background(), again); !cleared {
		t.Errorf("not cleared: the replacement counts as a pod on the dead mount")
	}
	if got := l.evictedPods(); got != "web-1" {
		t.Errorf("evicted %q, want only web-1: its replacement, created in the heal's second after the eviction, got the repaired mount", got)
	}
}
