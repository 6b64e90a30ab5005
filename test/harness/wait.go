package harness

import (
	"context"
	"fmt"
	"time"
)

// PollInterval is how often WaitFor and Eventually check their condition.
const PollInterval = 100 * time.Millisecond

// WaitFor polls cond until it holds, and returns an error with cond's last description after
// timeout or when ctx ends. It may run in any goroutine.
func WaitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
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
		case <-time.After(PollInterval):
		}
	}
}

// Eventually polls cond until it holds, and fails the test with cond's last description after
// timeout.
func Eventually(t TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if err := WaitFor(t.Context(), timeout, what, cond); err != nil {
		t.Fatalf("%v", err)
	}
}
