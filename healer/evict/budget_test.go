package evict

import (
	"testing"
	"time"
)

func TestBudgetAllowsNoMoreThanItsLimitInAnyMinute(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := map[string]struct {
		global, perNamespace int
		// spent are the evictions already made: namespace and seconds after t0.
		spent []struct {
			ns string
			at int
		}
		ns       string
		at       int
		wantWait time.Duration
	}{
		"empty budget: now": {global: 2, perNamespace: 2, ns: "a", at: 0, wantWait: 0},
		"global spent: until the oldest is a minute old": {global: 2, perNamespace: 2, spent: []struct {
			ns string
			at int
		}{{"a", 0}, {"b", 10}}, ns: "c", at: 20, wantWait: 40 * time.Second},
		"namespace spent, global not: until the namespace's oldest is a minute old": {global: 5, perNamespace: 1, spent: []struct {
			ns string
			at int
		}{{"a", 5}, {"b", 10}}, ns: "a", at: 30, wantWait: 35 * time.Second},
		"another namespace is not held up by a spent one": {global: 5, perNamespace: 1, spent: []struct {
			ns string
			at int
		}{{"a", 5}}, ns: "b", at: 30, wantWait: 0},
		"a minute later the budget is back": {global: 1, perNamespace: 1, spent: []struct {
			ns string
			at int
		}{{"a", 0}}, ns: "a", at: 60, wantWait: 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			b := newBudget(tc.global, tc.perNamespace)
			for _, s := range tc.spent {
				b.spend(s.ns, t0.Add(time.Duration(s.at)*time.Second))
			}
			if got := b.wait(tc.ns, t0.Add(time.Duration(tc.at)*time.Second)); got != tc.wantWait {
				t.Errorf("wait = %s, want %s", got, tc.wantWait)
			}
		})
	}
}
