package controller

import (
	"runtime"
	"runtime/debug"
	"testing"
)

// TestHeapBudget: the limit leaves the live heap its headroom, follows it as it grows, and
// stays under the container's limit.
func TestHeapBudget(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	b := &heapBudget{}
	small := b.limit()
	if small < int64(ms.HeapAlloc)+minHeapHeadroom {
		t.Errorf("limit %d with a live heap of %d, want at least %d of headroom", small, ms.HeapAlloc, minHeapHeadroom)
	}

	kept := make([][]byte, 0, 256)
	for range 256 {
		kept = append(kept, make([]byte, 1<<20))
	}
	runtime.GC()
	grown := b.limit()
	if want := small + int64(float64(256<<20)*(1+heapHeadroomShare)*0.9); grown < want {
		t.Errorf("limit %d with 256 MiB more live, want at least %d", grown, want)
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
