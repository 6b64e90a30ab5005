package policy

import "sync"

// TermCache holds input parts that many volumes share (a StorageClass, a node, a driver's
// capabilities), each built once with its Rego form. Keys are the cached objects themselves (an
// informer replaces an object on every update, so an entry never goes stale) or values derived
// from them; the cache is emptied when it outgrows its bound, which bounds what replaced objects
// keep alive. Safe for concurrent use; what it returns is shared: read-only.
type TermCache[K comparable, V any] struct {
	mu  sync.Mutex
	m   map[K]V
	max int
}

// NewTermCache returns an empty cache of at most max entries.
func NewTermCache[K comparable, V any](max int) *TermCache[K, V] {
	return &TermCache[K, V]{m: map[K]V{}, max: max}
}

// Get returns the entry of k, built by build when there is none.
func (c *TermCache[K, V]) Get(k K, build func() V) V {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.m[k]; ok {
		return v
	}
	if len(c.m) >= c.max {
		clear(c.m)
	}
	v := build()
	c.m[k] = v
	return v
}

// Len is the number of entries.
func (c *TermCache[K, V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
