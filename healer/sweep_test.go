package healer

import (
	"testing"
	"time"
)

func TestRestartRetryWaitsDoubleUpToTheirBound(t *testing.T) {
	s := &Sweeper{opts: Options{RetryBase: 5 * time.Second, RetryMax: 30 * time.Second}}
	b := s.retryBackoff()
	want := []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 30 * time.Second, 30 * time.Second, 30 * time.Second}
	for i, w := range want {
		if got := b.Step(); got != w {
			t.Fatalf("wait before try %d = %s, want %s", i+2, got, w)
		}
	}
}
