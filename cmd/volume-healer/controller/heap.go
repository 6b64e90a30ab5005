package controller

import (
	"context"
	"math"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// What the controller keeps is its informer caches: once they are full, the live heap changes
// only as the cluster does. Left alone, the Go runtime lets the heap grow to twice the live heap
// between collections (GOGC=100) and keeps the pages: a controller that holds about 150 MiB of
// caches can settle near twice that plus its binary, the rest garbage of watch events, sweeps
// and metric scrapes. heapBudget instead holds the runtime's soft memory limit a headroom above the live
// heap while the controller is at rest, so that the collector runs when the garbage reaches the
// headroom and the scavenger returns what is above it. The limit follows the live heap as the
// cluster grows or shrinks, and never goes above the limit taken from the container
// (config.SetMemoryLimit).
//
// While sweeps run, and for a minute after, the budget steps aside: a sweep of 100,000 volumes
// allocates about 230 MiB, and held to a quarter of the live heap the collector would run for
// it about ten times instead of once or twice, tripling the sweep's CPU time (measured
// in-process: 1.5 to 1.8 CPU s with the runtime's default pacing, 4.7 to 5.6 with the limit).

// heapHeadroomShare and minHeapHeadroom are the garbage allowed between collections at rest,
// above the live heap: a quarter of it, at least 32 MiB.
const (
	heapHeadroomShare = 0.25
	minHeapHeadroom   = 32 << 20
)

// heapBudgetPeriod is how often the limit is brought up to date with the live heap, and
// heapBudgetQuiet how long after the last sweep the controller is at rest.
const (
	heapBudgetPeriod = 10 * time.Second
	heapBudgetQuiet  = time.Minute
)

// heapBudget keeps the Go runtime's soft memory limit at the live heap, its headroom, and the
// memory the runtime uses besides the heap (stacks, its own metadata) while the controller is at
// rest, and at the container's limit (or none) while it sweeps.
type heapBudget struct {
	// ceiling is the limit taken from the container; 0 for none.
	ceiling int64
	// quiet reports when the last sweep ended, and false while one runs; nil for never.
	quiet func() (time.Time, bool)
	// now is the clock; time.Now when nil.
	now func() time.Time

	mu sync.Mutex
	// last is the limit set last; 0 before run set the first.
	last int64
}

// runtimeMemory are the runtime/metrics that limit reads.
var runtimeMemory = []string{
	"/gc/heap/live:bytes",
	"/memory/classes/total:bytes",
	"/memory/classes/heap/released:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/free:bytes",
}

// limit returns the soft memory limit for the runtime's memory at rest: the live heap as of the
// last collection, its headroom, and what the runtime holds besides heap objects and free pages.
func (b *heapBudget) limit() int64 {
	s := make([]metrics.Sample, len(runtimeMemory))
	for i, name := range runtimeMemory {
		s[i].Name = name
	}
	metrics.Read(s)
	v := make([]int64, len(s))
	for i := range s {
		if s[i].Value.Kind() == metrics.KindUint64 {
			v[i] = int64(s[i].Value.Uint64())
		}
	}
	live, total, released, objects, free := v[0], v[1], v[2], v[3], v[4]
	other := max(total-released-objects-free, 0)
	limit := live + max(int64(float64(live)*heapHeadroomShare), minHeapHeadroom) + other
	if b.ceiling > 0 {
		limit = min(limit, b.ceiling)
	}
	return limit
}

// busyLimit is the limit while sweeps run: the container's, or none.
func (b *heapBudget) busyLimit() int64 {
	if b.ceiling > 0 {
		return b.ceiling
	}
	return math.MaxInt64
}

// atRest reports whether no sweep runs and none ended within heapBudgetQuiet.
func (b *heapBudget) atRest() bool {
	if b.quiet == nil {
		return true
	}
	since, ok := b.quiet()
	if !ok {
		return false
	}
	now := time.Now
	if b.now != nil {
		now = b.now
	}
	return now().Sub(since) >= heapBudgetQuiet
}

// update sets the limit for now and returns it.
func (b *heapBudget) update() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	limit := b.busyLimit()
	if b.atRest() {
		limit = b.limit()
	}
	debug.SetMemoryLimit(limit)
	b.last = limit
	return limit
}

// sweepStarted lifts the limit at once when a sweep starts, rather than at the next update.
func (b *heapBudget) sweepStarted() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.last == 0 || b.last == b.busyLimit() {
		return
	}
	b.last = b.busyLimit()
	debug.SetMemoryLimit(b.last)
}

// run keeps the limit up to date until ctx ends. Call it once the caches are full.
func (b *heapBudget) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	logger.Info("Go memory limit follows the caches", "bytes", b.update(), "ceiling", b.ceiling)
	t := time.NewTicker(heapBudgetPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			b.mu.Lock()
			before := b.last
			b.mu.Unlock()
			if limit := b.update(); limit > before+before/10 || limit < before-before/10 {
				logger.V(1).Info("Go memory limit follows the caches", "bytes", limit)
			}
		}
	}
}
