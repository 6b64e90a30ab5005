package controller

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

// TestHeapBudget: at rest the limit leaves the live heap its headroom, follows it as it grows,
// and stays under the container's limit.
func TestHeapBudget(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	// The live heap as the runtime marked it at the last collection, the measure the budget
	// goes by: HeapAlloc would count what other goroutines allocated since.
	liveHeap := func() int64 {
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		metrics.Read(s)
		return int64(s[0].Value.Uint64())
	}
	runtime.GC()
	b := &heapBudget{}
	live := liveHeap()
	small := b.limit()
	if small < live+minHeapHeadroom {
		t.Errorf("limit %d with a live heap of %d, want at least %d of headroom", small, live, minHeapHeadroom)
	}

	kept := make([][]byte, 0, 256)
	for range 256 {
		kept = append(kept, make([]byte, 1<<20))
	}
	runtime.GC()
	grown := b.limit()
	// 256 MiB more live raise the limit by at least as much: the headroom grows with the live
	// heap, while the runtime's own overhead may shrink a little as it returns memory.
	if want := small + 256<<20; grown < want {
		t.Errorf("limit %d with 256 MiB more live (limit %d before), want at least %d", grown, small, want)
	}
	runtime.KeepAlive(kept)

	capped := &heapBudget{ceiling: 64 << 20}
	if got := capped.update(); got != 64<<20 {
		t.Errorf("limit %d under a ceiling of %d, want the ceiling", got, 64<<20)
	}
	if got := debug.SetMemoryLimit(-1); got != 64<<20 {
		t.Errorf("runtime's memory limit %d, want %d", got, 64<<20)
	}
}

// TestHeapBudgetStepsAsideForSweeps: while a sweep runs and for heapBudgetQuiet after, the limit
// is the container's (or none); a sweep that starts lifts it at once.
func TestHeapBudgetStepsAsideForSweeps(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	now := time.Unix(1000, 0)
	var (
		running bool
		ended   time.Time
	)
	for name, tc := range map[string]struct {
		ceiling int64
		busy    int64
	}{
		"no container limit": {0, math.MaxInt64},
		"container limit":    {1 << 40, 1 << 40},
	} {
		running, ended = false, time.Time{}
		b := &heapBudget{ceiling: tc.ceiling, now: func() time.Time { return now },
			quiet: func() (time.Time, bool) { return ended, !running }}
		rest := b.update()
		if rest >= tc.busy {
			t.Fatalf("%s: limit at rest %d, want below %d", name, rest, tc.busy)
		}
		running = true
		b.sweepStarted()
		if got := debug.SetMemoryLimit(-1); got != tc.busy {
			t.Errorf("%s: a sweep started, runtime's limit %d, want %d", name, got, tc.busy)
		}
		if got := b.update(); got != tc.busy {
			t.Errorf("%s: while a sweep runs the limit is %d, want %d", name, got, tc.busy)
		}
		running, ended = false, now.Add(-heapBudgetQuiet/2)
		if got := b.update(); got != tc.busy {
			t.Errorf("%s: half a quiet period after a sweep the limit is %d, want %d", name, got, tc.busy)
		}
		ended = now.Add(-heapBudgetQuiet)
		if got := b.update(); got >= tc.busy {
			t.Errorf("%s: a quiet period after a sweep the limit is %d, want the budget's", name, got)
		}
	}
}
