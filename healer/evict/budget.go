package evict

import (
	"time"
)

// window is a per-minute budget: at most limit events in any minute. It keeps the times of the
// events of the last minute, so a burst of limit events spends the budget until the first of
// them is a minute old, and no minute ever sees more than limit.
type window struct {
	limit int
	times []time.Time
}

// wait returns how long from now until one more event fits, 0 when it fits now.
func (w *window) wait(now time.Time) time.Duration {
	w.expire(now)
	if len(w.times) < w.limit {
		return 0
	}
	return w.times[len(w.times)-w.limit].Add(time.Minute).Sub(now)
}

// spend records an event at now.
func (w *window) spend(now time.Time) { w.times = append(w.times, now) }

func (w *window) expire(now time.Time) {
	i := 0
	for i < len(w.times) && !now.Before(w.times[i].Add(time.Minute)) {
		i++
	}
	w.times = w.times[i:]
}

// budget holds the global and the per-namespace per-minute eviction budgets. It is used by one
// worker at a time and has no lock.
type budget struct {
	global       window
	perNamespace int
	namespaces   map[string]*window
}

func newBudget(global, perNamespace int) *budget {
	return &budget{global: window{limit: global}, perNamespace: perNamespace, namespaces: map[string]*window{}}
}

// wait returns how long until an eviction in namespace fits both budgets, 0 when it fits now.
func (b *budget) wait(namespace string, now time.Time) time.Duration {
	d := b.global.wait(now)
	if w, ok := b.namespaces[namespace]; ok {
		d = max(d, w.wait(now))
		if len(w.times) == 0 {
			delete(b.namespaces, namespace)
		}
	}
	return d
}

// spend records an eviction in namespace at now.
func (b *budget) spend(namespace string, now time.Time) {
	b.global.spend(now)
	w, ok := b.namespaces[namespace]
	if !ok {
		w = &window{limit: b.perNamespace}
		b.namespaces[namespace] = w
	}
	w.spend(now)
}
