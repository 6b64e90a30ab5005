package trigger

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/scheduler"
)

func TestManualRequests(t *testing.T) {
	req := func(value, handled string) map[string]string {
		a := map[string]string{}
		if value != "" {
			a[annotations.SweepRequest] = value
		}
		if handled != "" {
			a[annotations.SweepHandled] = handled
		}
		return a
	}
	tests := map[string]struct {
		obj  client.Object
		want *scheduler.Sweep
	}{
		"PVC: its volume": {
			obj: &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db", Annotations: req("r1", "")},
				Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-db"}},
			want: &scheduler.Sweep{Trigger: scheduler.TriggerManual, PV: "pv-db", Marker: "r1"},
		},
		"StorageClass: its volumes": {
			obj:  &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold", Annotations: req("r2", "r1")}},
			want: &scheduler.Sweep{Trigger: scheduler.TriggerManual, StorageClass: "gold", Marker: "r2"},
		},
		"CSIAddonsNode: its driver on its node": {
			obj: &csiaddonsv1alpha1.CSIAddonsNode{ObjectMeta: metav1.ObjectMeta{Namespace: "csi", Name: "n", Annotations: req("r3", "")},
				Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{Name: "rbd", NodeID: "node-a"}}},
			want: &scheduler.Sweep{Trigger: scheduler.TriggerManual, Driver: "rbd", Node: "node-a", Marker: "r3"},
		},
		"request already handled": {
			obj: &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold", Annotations: req("r2", "r2")}},
		},
		"no request": {
			obj: &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold"}},
		},
		"unbound PVC": {
			obj: &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db", Annotations: req("r1", "")}},
		},
		"request under the key of 0.1.0": {
			obj: &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold", Annotations: map[string]string{
				annotations.Previous(annotations.SweepRequest): "r4"}}},
			want: &scheduler.Sweep{Trigger: scheduler.TriggerManual, StorageClass: "gold", Marker: "r4"},
		},
		"request 0.1.0 handled": {
			obj: &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold", Annotations: map[string]string{
				annotations.Previous(annotations.SweepRequest): "r4", annotations.Previous(annotations.SweepHandled): "r4"}}},
		},
		"new request after one 0.1.0 handled": {
			obj: &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold", Annotations: map[string]string{
				annotations.Previous(annotations.SweepRequest): "r4", annotations.Previous(annotations.SweepHandled): "r4",
				annotations.SweepRequest: "r5"}}},
			want: &scheduler.Sweep{Trigger: scheduler.TriggerManual, StorageClass: "gold", Marker: "r5"},
		},
		"request under the key of 0.1.0 handled under the new key": {
			obj: &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold", Annotations: map[string]string{
				annotations.Previous(annotations.SweepRequest): "r4", annotations.SweepHandled: "r4"}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var got []scheduler.Sweep
			m, err := NewManual(ManualOptions{Sweeps: func(s scheduler.Sweep) { got = append(got, s) }})
			if err != nil {
				t.Fatal(err)
			}
			m.Observe(context.Background(), tc.obj)
			m.Observe(context.Background(), tc.obj) // a resync does not start it twice
			if tc.want == nil {
				if len(got) != 0 {
					t.Fatalf("sweeps = %+v, want none", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("sweeps = %+v, want one", got)
			}
			s := got[0]
			if s.Trigger != tc.want.Trigger || s.PV != tc.want.PV || s.StorageClass != tc.want.StorageClass ||
				s.Driver != tc.want.Driver || s.Node != tc.want.Node || s.Marker != tc.want.Marker || s.Requester != tc.obj {
				t.Fatalf("sweep = %+v, want %+v requested by the object", s, *tc.want)
			}
		})
	}
}

func TestManualNewRequestAfterHandled(t *testing.T) {
	var got []scheduler.Sweep
	m, _ := NewManual(ManualOptions{Sweeps: func(s scheduler.Sweep) { got = append(got, s) }})
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold", Annotations: map[string]string{annotations.SweepRequest: "r1"}}}
	m.Observe(context.Background(), sc)
	sc.Annotations[annotations.SweepHandled] = "r1"
	m.Observe(context.Background(), sc)
	m.Ended(got[0], false)
	sc.Annotations[annotations.SweepRequest] = "r2"
	m.Observe(context.Background(), sc)
	if len(got) != 2 || got[1].Marker != "r2" {
		t.Fatalf("sweeps = %+v, want r1 then r2", got)
	}
}

// sweepLog records the sweeps handed out and how many of one object were in flight at most.
type sweepLog struct {
	mu       sync.Mutex
	started  []scheduler.Sweep
	inFlight map[string]int
	most     int
}

func (l *sweepLog) sweep(s scheduler.Sweep) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inFlight == nil {
		l.inFlight = map[string]int{}
	}
	l.started = append(l.started, s)
	l.inFlight[s.Source.String()]++
	l.most = max(l.most, l.inFlight[s.Source.String()])
}

// end ends the i-th sweep, as the sweep runner does.
func (l *sweepLog) end(m *Manual, i int) {
	l.mu.Lock()
	s := l.started[i]
	l.inFlight[s.Source.String()]--
	l.mu.Unlock()
	m.Ended(s, true)
}

func (l *sweepLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.started)
}

// TestManualCoalescesRequestsPerPVC: a namespace user who edits a PVC's request annotation a
// thousand times while its sweep runs causes no second sweep of it in flight, and one more sweep
// once it ends, of the latest request; a thousand more edits then, one more again.
func TestManualCoalescesRequestsPerPVC(t *testing.T) {
	var log sweepLog
	m, err := NewManual(ManualOptions{Sweeps: log.sweep, Clock: clocktesting.NewFakeClock(time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db"},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-db"}}
	request := 0
	edit := func(n int) {
		for range n {
			edited := pvc.DeepCopy()
			edited.Annotations = map[string]string{annotations.SweepRequest: fmt.Sprintf("r%d", request)}
			request++
			m.Observe(context.Background(), edited)
		}
	}
	goroutines := runtime.NumGoroutine()
	edit(1000)
	if n := log.count(); n != 1 {
		t.Fatalf("1000 requests on one PVC while its sweep runs started %d sweeps, want 1", n)
	}
	if n := runtime.NumGoroutine() - goroutines; n > 2 {
		t.Errorf("1000 requests left %d more goroutines, want none per request", n)
	}
	log.end(m, 0)
	if n := log.count(); n != 2 || log.started[1].Marker != "r999" {
		t.Fatalf("after the first sweep ended: %d sweeps, the second of %q; want 2, the second of the latest request r999", n, log.started[len(log.started)-1].Marker)
	}
	edit(1000)
	log.end(m, 1)
	log.end(m, 2)
	if n := log.count(); n != 3 || log.most != 1 {
		t.Errorf("2000 requests on one PVC: %d sweeps, at most %d in flight at once; want 3, and 1", n, log.most)
	}
	if m.Pending() != 1 {
		t.Errorf("Pending = %d, want the PVC's last request until it is recorded handled", m.Pending())
	}
}

// TestManualRateLimits: requests on many PVCs start at most PerNamespacePerMinute sweeps of one
// namespace and PerMinute across the cluster in a minute; the others wait, in one queue, and start
// as the budgets refill.
func TestManualRateLimits(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	var log sweepLog
	m, err := NewManual(ManualOptions{Sweeps: log.sweep, Clock: clk, PerMinute: 10, PerNamespacePerMinute: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Start(ctx) }()
	defer func() { cancel(); <-done }()
	request := func(ns string, n int) {
		for i := range n {
			m.Observe(ctx, &corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("pvc-%d", i), Annotations: map[string]string{annotations.SweepRequest: "r"}},
				Spec:       corev1.PersistentVolumeClaimSpec{VolumeName: fmt.Sprintf("pv-%s-%d", ns, i)}})
		}
	}
	request("shop", 50)
	if n := log.count(); n != 3 {
		t.Fatalf("50 requests in one namespace started %d sweeps at once, want 3", n)
	}
	for i := range 20 {
		request(fmt.Sprintf("team-%d", i), 1)
	}
	if n := log.count(); n != 10 {
		t.Fatalf("requests in 21 namespaces started %d sweeps at once, want 10", n)
	}
	// A minute later the cluster's budget has refilled, 10 starts, and the namespace's 3 of them.
	for range 61 {
		if !clk.HasWaiters() {
			time.Sleep(time.Millisecond)
		}
		clk.Step(time.Second)
	}
	waitFor := func(want int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for log.count() < want && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if n := log.count(); n != want {
			t.Fatalf("%d sweeps after a minute, want %d", n, want)
		}
	}
	waitFor(20)
	time.Sleep(20 * time.Millisecond)
	if n := log.count(); n != 20 {
		t.Errorf("%d sweeps after a minute, want 20: 10 a minute", n)
	}
	shop := 0
	for _, s := range log.started {
		if s.Source.Namespace == "shop" {
			shop++
		}
	}
	if shop != 6 {
		t.Errorf("%d sweeps in the namespace shop after a minute, want 6: 3 a minute", shop)
	}
}

// TestDocsSayWhoMayRequestSweeps: docs/triggers.md tells operators that any user who may update a
// PVC can request a sweep, and what a request costs at most, with the defaults of this package.
func TestDocsSayWhoMayRequestSweeps(t *testing.T) {
	raw, err := os.ReadFile("../../docs/triggers.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	begin := strings.Index(doc, "\n## Manual sweeps\n")
	if begin < 0 {
		t.Fatal("docs/triggers.md has no section Manual sweeps")
	}
	section := doc[begin+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	section = strings.Join(strings.Fields(section), " ")
	for _, want := range []string{
		"**Who can request one.** Whoever may update the object",
		"any user allowed to `update` or `patch` PersistentVolumeClaims in a namespace",
		"**What a request costs.**",
		"at most one requested sweep in flight and one waiting",
		fmt.Sprintf("`manualSweeps.perMinute` requested sweeps start in any minute across the cluster (%d)", DefaultManualPerMinute),
		fmt.Sprintf("`manualSweeps.perNamespacePerMinute` (%d) in one namespace", DefaultManualPerNamespacePerMinute),
		"one queue that one goroutine serves",
	} {
		if !strings.Contains(section, want) {
			t.Errorf("docs/triggers.md, Manual sweeps, does not say %q", want)
		}
	}
	if strings.Contains(strings.ToLower(section), "only administrators") {
		t.Error("docs/triggers.md, Manual sweeps, says only administrators can request sweeps; any user who may update a PVC can")
	}
}
