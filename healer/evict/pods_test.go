package evict

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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

// mounting gives the pod a container that mounts its claim with propagation, nil for None.
func mounting(p *corev1.Pod, propagation *corev1.MountPropagationMode) *corev1.Pod {
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: fmt.Sprintf("c%d", len(p.Spec.Containers)),
		VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data", MountPropagation: propagation}}})
	return p
}

// After a heal, a pod whose every container mounts the volume with HostToContainer (or
// Bidirectional) propagation received the repaired mount: a dead copy the heal still found is
// not in it, and it keeps running. Pods with a container on None propagation are restarted. A
// recycle (the volume is dead on the node) restarts them all.
func TestHealLeavesPodsThatReceiveTheRepairedMount(t *testing.T) {
	h2c, bidi, none := corev1.MountPropagationHostToContainer, corev1.MountPropagationBidirectional, corev1.MountPropagationNone
	pods := func() []runtime.Object {
		return []runtime.Object{
			mounting(pod("slave", "node-a", "data", "StatefulSet"), &h2c),
			mounting(mounting(pod("both-ways", "node-a", "data", "StatefulSet"), &bidi), &h2c),
			mounting(pod("private", "node-a", "data", "ReplicaSet"), nil),
			mounting(mounting(pod("mixed", "node-a", "data", "ReplicaSet"), &h2c), &none),
		}
	}
	t.Run("heal", func(t *testing.T) {
		l := newLadder(t, true, nil, pods()...)
		req := healRequest(t0)
		l.e.Add(req)
		if retry, _, cleared := l.e.process(context.Background(), req); retry || !cleared {
			t.Fatalf("process = retry %t, cleared %t; want the pods on None evicted at once", retry, cleared)
		}
		if got := sortedList(l.evictedPods()); got != "mixed,private" {
			t.Errorf("evicted %q, want mixed,private: the pods with a container on None propagation, not those that received the repaired mount", got)
		}
	})
	t.Run("recycle", func(t *testing.T) {
		l := newLadder(t, true, nil, pods()...)
		req := recycleRequest("MountGone")
		l.e.Add(req)
		if retry, _, _ := l.e.process(context.Background(), req); retry {
			t.Fatal("process asks for a retry; want every pod evicted at once")
		}
		if got := sortedList(l.evictedPods()); got != "both-ways,mixed,private,slave" {
			t.Errorf("evicted %q, want every pod: a recycle restarts the pods of a volume dead on the node whatever their propagation", got)
		}
	})
}

// sortedList sorts a comma-separated list.
func sortedList(s string) string {
	items := strings.Split(s, ",")
	slices.Sort(items)
	return strings.Join(items, ",")
}
