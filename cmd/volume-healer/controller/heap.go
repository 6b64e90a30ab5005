package controller

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"k8s.io/klog/v2"
)

// What the controller keeps is its informer caches: once they are full, the live heap changes
// only as the cluster does. Left alone, the Go runtime lets the heap grow to twice the live heap
// between collections (GOGC=100), and keeps the pages: a controller that holds 150 MiB of caches
// settles at an RSS near 300 MiB plus its binary, most of it garbage of watch events, sweeps and
// metric scrapes. heapBudget instead holds the runtime's soft memory limit a headroom above the
// live heap, so that the collector runs when the garbage reaches the headroom and the scavenger
// returns what is above it. The limit follows the live heap as the cluster grows or shrinks, and
// never goes above the limit taken from the container (config.SetMemoryLimit).

// heapHeadroomShare and minHeapHeadroom are the garbage allowed between collections, above the
// live heap: a quarter of it, at least 32 MiB. A collection of caches of 100,000 volumes marks
// about 150 MiB and runs about every 38 MiB allocated.
const (
	heapHeadroomShare = 0.25
	minHeapHeadroom   = 32 << 20
)

// heapBudgetPeriod is how often the limit is brought up to date with the live heap.
const heapBudgetPeriod = 10 * time.Second

// heapBudget keeps the Go runtime's soft memory limit at the live heap, its headroom, and the
// memory the runtime uses besides the heap (stacks, its own metadata).
type heapBudget struct {
	// ceiling is the limit taken from the container; 0 for none.
	ceiling int64
	// last is the limit set last; 0 before the first.
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

// limit returns the soft memory limit for the runtime's memory now: the live heap as of the last
// collection, its headroom, and what the runtime holds besides heap objects and free pages.
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

// update sets the limit and returns it.
func (b *heapBudget) update() int64 {
	limit := b.limit()
	debug.SetMemoryLimit(limit)
	b.last = limit
	return limit
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
			before := b.last
			if limit := b.update(); limit > before+before/10 || limit < before-before/10 {
				logger.V(1).Info("Go memory limit follows the caches", "bytes", limit)
			}
		}
	}
}
