// Package poll is the one way the project's tests wait for a condition: test/harness offers it to
// the suites as WaitFor and Eventually, and the unit tests use it directly. It imports nothing of
// the project, so that the in-package tests of a package test/harness imports (scheduler/dispatch,
// sidecar) can use it without an import cycle.
package poll

import (
	"context"
	"fmt"
	"time"
)

// Interval is the longest pause between two checks of a condition. The first check is at once and
// the pauses grow from FirstInterval, doubling, to Interval: a condition that goroutines of the
// test meet within a millisecond is seen within a millisecond, and one that takes a process or the
// API server seconds is checked ten times a second.
const Interval = 100 * time.Millisecond

// FirstInterval is the pause after the first check that fails.
const FirstInterval = time.Millisecond

// Until checks cond until it holds, and returns an error with cond's last description after
// timeout or when ctx ends. It may run in any goroutine.
func Until(ctx context.Context, timeout time.Duration, what string, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	pause := FirstInterval
	for {
		ok, state := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s (last seen: %s)", timeout, what, state)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up waiting for %s: %w (last seen: %s)", what, ctx.Err(), state)
		case <-time.After(pause):
		}
		pause = min(2*pause, Interval)
	}
}

// T is the part of testing.TB that Eventually uses.
type T interface {
	Helper()
	Context() context.Context
	Fatalf(format string, args ...any)
}

// Eventually checks cond until it holds, and fails the test with cond's last description after
// timeout. Like t.Fatalf, it may only be called from the test's goroutine.
func Eventually(t T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if err := Until(t.Context(), timeout, what, cond); err != nil {
		t.Fatalf("%v", err)
	}
}

// True adapts a condition without a description of what it saw, for Until and Eventually.
func True(cond func() bool) func() (bool, string) {
	return func() (bool, string) { return cond(), "not yet" }
}
