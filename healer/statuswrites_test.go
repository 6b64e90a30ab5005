package healer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler/dispatch"
)

// A claim's statuses are written in the order asked for, a value asked for while an earlier
// write is in flight replaces the ones waiting with it, whoever waits for a write, made or
// replaced, is released, and what follows a status (its Event) runs once it is written.
func TestStatusWritesEndWithTheLastValueOfEachClaim(t *testing.T) {
	gate := make(chan struct{})
	var mu sync.Mutex
	written := map[string][]string{}
	w := statusWrites{patch: func(_ context.Context, claim types.NamespacedName, value *string) {
		if claim.Name == "a" {
			<-gate
		}
		v := "removed"
		if value != nil {
			v = *value
		}
		mu.Lock()
		defer mu.Unlock()
		written[claim.Name] = append(written[claim.Name], v)
	}}
	ctx := context.Background()
	a, b := types.NamespacedName{Namespace: "app", Name: "a"}, types.NamespacedName{Namespace: "app", Name: "b"}
	val := func(s string) *string { return &s }
	var first, later sync.WaitGroup
	w.add(ctx, a, val("1"), &first)
	// The first write of a is in flight (held by gate) once b's is written by another writer.
	w.add(ctx, b, val("x"), &first)
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(written["b"])
		mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b's status was not written while a's write was held: one slow write holds back the others")
		}
		time.Sleep(time.Millisecond)
	}
	var after []string
	followed := func(what string) func() {
		return func() {
			mu.Lock()
			defer mu.Unlock()
			after = append(after, what+" after "+strings.Join(written["a"], ","))
		}
	}
	w.then(a, followed("event of 1"))
	w.add(ctx, a, val("2"), &later)
	w.add(ctx, a, val("3"), &later)
	w.then(a, followed("event of 3"))
	w.add(ctx, a, nil, &later)
	w.add(ctx, a, val("4"), &later)
	w.then(b, followed("event of x"))
	close(gate)
	waited := make(chan struct{})
	go func() { first.Wait(); later.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("the writes' waiters were not released")
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(written["a"], ","); got != "1,4" {
		t.Errorf("a written %s; want 1 then 4 (2, 3 and the removal replaced while 1 was in flight)", got)
	}
	if got := strings.Join(written["b"], ","); got != "x" {
		t.Errorf("b written %s; want x", got)
	}
	// b had nothing in flight: its event ran at once, while a's first write was held.
	if got, want := strings.Join(after, "; "), "event of x after ; event of 1 after 1; event of 3 after 1,4"; got != want {
		t.Errorf("what followed the statuses ran as %q; want %q", got, want)
	}
}

// However many claims wait, at most maxStatusWriters writes run at once, and every one is made.
func TestStatusWritesAreBounded(t *testing.T) {
	var running, most, made atomic.Int32
	gate := make(chan struct{})
	w := statusWrites{patch: func(context.Context, types.NamespacedName, *string) {
		n := running.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		<-gate
		running.Add(-1)
		made.Add(1)
	}}
	var wg sync.WaitGroup
	const claims = 5 * maxStatusWriters
	for i := range claims {
		w.add(context.Background(), types.NamespacedName{Namespace: "app", Name: fmt.Sprint("c", i)}, nil, &wg)
	}
	time.Sleep(50 * time.Millisecond)
	close(gate)
	wg.Wait()
	if m := most.Load(); m > maxStatusWriters || m == 0 {
		t.Errorf("%d writes ran at once; want 1 to %d", m, maxStatusWriters)
	}
	if made.Load() != claims {
		t.Errorf("%d of %d statuses written", made.Load(), claims)
	}
}

// The claim's status PATCH is not made inside the volume's task: while the API server holds the
// first healed volume's PATCH, the node's one place in its budget goes on to the next volume's
// probe and heal. The sweep still ends with both claims marked healed.
func TestSlowStatusWritesDoNotHoldBackHeals(t *testing.T) {
	f := newFixtureDispatching(t, 2, false, dispatch.Options{Global: 1, PerDriver: 1, PerNode: 1, BackoffBase: time.Millisecond, BackoffMax: 4 * time.Millisecond, MaxAttempts: 2})
	gate := make(chan struct{})
	var held atomic.Int32
	f.sweeper.opts.Client = interceptor.NewClient(f.client.(client.WithWatch), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*corev1.PersistentVolumeClaim); ok {
				held.Add(1)
				select {
				case <-gate:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	})
	summaries := f.sweepBroken("v1", "v2")

	deadline := time.Now().Add(10 * time.Second)
	for {
		var heals int
		f.sidecars.set(func(s *fakeSidecars) { heals = s.heals["v1"] + s.heals["v2"] })
		if heals == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 heals made while the API server held %d status PATCH(es): the PATCH holds the node's budget", heals, held.Load())
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case sum := <-summaries:
		t.Fatalf("the sweep ended (%+v) before its statuses were written", sum)
	case <-time.After(50 * time.Millisecond):
	}
	if events := f.events(); strings.Contains(events, ReasonVolumeHealed) {
		t.Errorf("a %s Event before the claim's status says healed:\n%s", ReasonVolumeHealed, events)
	}
	close(gate)
	var sum Summary
	select {
	case sum = <-summaries:
	case <-time.After(10 * time.Second):
		t.Fatal("the sweep did not end once the API server answered")
	}
	if sum.Healed != 2 || sum.Failed != 0 {
		t.Errorf("summary = %+v; want 2 healed", sum)
	}
	if n := strings.Count(f.events(), ReasonVolumeHealed); n != 2 {
		t.Errorf("%d %s Events once the statuses were written; want 2", n, ReasonVolumeHealed)
	}
	for _, claim := range []string{"claim-v1", "claim-v2"} {
		var pvc corev1.PersistentVolumeClaim
		if err := f.client.Get(context.Background(), client.ObjectKey{Namespace: "app", Name: claim}, &pvc); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(pvc.Annotations[annotations.VolumeStatus], `"result":"healed"`) {
			t.Errorf("%s status = %q; want healed", claim, pvc.Annotations[annotations.VolumeStatus])
		}
	}
}

// A status write that panics (a bug in a client) loses that write only: the sweep ends, the
// other claim's status is written, and the panic is counted.
func TestPanickingStatusWriteLosesThatWriteOnly(t *testing.T) {
	f := newFixture(t, 2, false)
	f.sweeper.opts.Metrics = NewMetrics(prometheus.NewRegistry())
	f.sweeper.opts.Client = interceptor.NewClient(f.client.(client.WithWatch), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if obj.GetName() == "claim-v1" {
				panic("nil map")
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	})
	summaries := f.sweepBroken("v1", "v2")
	select {
	case sum := <-summaries:
		if sum.Healed != 2 {
			t.Errorf("summary = %+v; want 2 healed", sum)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the sweep did not end after a status write panicked")
	}
	var pvc corev1.PersistentVolumeClaim
	if err := f.client.Get(context.Background(), client.ObjectKey{Namespace: "app", Name: "claim-v2"}, &pvc); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(pvc.Annotations[annotations.VolumeStatus], `"result":"healed"`) {
		t.Errorf("claim-v2 status = %q; want healed", pvc.Annotations[annotations.VolumeStatus])
	}
	if got := testutil.ToFloat64(f.sweeper.opts.Metrics.goroutinePanics.WithLabelValues(goroutineStatusWrite)); got != 1 {
		t.Errorf("volume_healer_sweep_goroutine_panics_total{goroutine=%q} = %v, want 1", goroutineStatusWrite, got)
	}
}

// sweepBroken makes the mounts of pvs gone and healable, and runs a restart sweep in the
// background; its summary comes on the channel.
func (f *fixture) sweepBroken(pvs ...string) <-chan Summary {
	for _, pv := range pvs {
		f.sidecars.health[pv], f.sidecars.healable[pv] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}, true
	}
	summaries := make(chan Summary, 1)
	go func() { summaries <- f.sweeper.Run(context.Background(), f.restart()) }()
	return summaries
}
