package sidecar

import (
	"testing"
	"time"
)

func TestRegistrationRetryWaitsDoubleUpToTheirBound(t *testing.T) {
	for name, tc := range map[string]struct {
		base, ceiling time.Duration
		want          []time.Duration
	}{
		"the defaults": {500 * time.Millisecond, 30 * time.Second, []time.Duration{
			500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second,
			16 * time.Second, 30 * time.Second, 30 * time.Second}},
		"a bound below the first wait": {time.Second, 300 * time.Millisecond, []time.Duration{
			time.Second, 300 * time.Millisecond, 300 * time.Millisecond}},
	} {
		t.Run(name, func(t *testing.T) {
			b := retryBackoff(tc.base, tc.ceiling)
			for i, w := range tc.want {
				if got := b.Step(); got != w {
					t.Fatalf("wait %d = %s, want %s", i+1, got, w)
				}
			}
		})
	}
}
