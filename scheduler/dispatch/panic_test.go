package dispatch

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// A task whose work panics (one bad object) fails alone, is not retried, and is counted; the
// other tasks, and the dispatcher, go on. A Done that panics does not stop the dispatcher either.
func TestDispatchSurvivesPanickingTasks(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	d, err := New(Options{Global: 2, PerDriver: 2, PerNode: 2, MaxAttempts: 3, BackoffBase: time.Millisecond, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	startDispatcher(t, d)

	results := make(chan Result, 3)
	runs := 0
	d.Submit(
		Task{Volume: "bad", Driver: "rbd", Node: "n", Trigger: scheduler.TriggerRestart,
			Run:  func(context.Context) error { runs++; panic("nil map in a malformed PV") },
			Done: func(r Result) { results <- r }},
		Task{Volume: "good", Driver: "rbd", Node: "n", Trigger: scheduler.TriggerRestart,
			Run:  func(context.Context) error { return nil },
			Done: func(r Result) { results <- r; panic("Done of good panics") }},
	)
	got := map[bool]Result{}
	for range 2 {
		select {
		case r := <-results:
			got[r.Err == nil] = r
		case <-time.After(10 * time.Second):
			t.Fatal("a task never ended")
		}
	}
	bad, ok := got[false]
	if !ok || !errors.Is(bad.Err, ErrPermanent) || !strings.Contains(bad.Err.Error(), "nil map in a malformed PV") {
		t.Errorf("the panicking task ended with %+v, want a permanent error naming the panic", bad)
	}
	if runs != 1 {
		t.Errorf("the panicking task ran %d times, want once: a panic is not retried", runs)
	}
	if _, ok := got[true]; !ok {
		t.Error("the good task did not succeed next to the panicking one")
	}

	// The dispatcher still serves after both panics.
	d.Submit(Task{Volume: "later", Driver: "rbd", Node: "n", Trigger: scheduler.TriggerSchedule,
		Run: func(context.Context) error { return nil }, Done: func(r Result) { results <- r }})
	select {
	case r := <-results:
		if r.Err != nil {
			t.Errorf("a task after the panics failed: %v", r.Err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the dispatcher stopped serving after a panic")
	}
	// The Done that panicked sent its result first; its panic is counted just after.
	_ = poll.Until(t.Context(), 5*time.Second, "the second panic counted", poll.True(func() bool { return testutil.ToFloat64(m.panics) >= 2 }))
	if n := testutil.ToFloat64(m.panics); n != 2 {
		t.Errorf("volume_healer_dispatch_task_panics_total = %v, want 2 (one Run, one Done)", n)
	}
}
