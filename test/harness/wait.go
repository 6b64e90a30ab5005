package harness

import (
	"context"
	"time"

	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// PollInterval is the longest pause between two checks of WaitFor's and Eventually's condition.
const PollInterval = poll.Interval

// WaitFor checks cond until it holds, and returns an error with cond's last description after
// timeout or when ctx ends. It may run in any goroutine. It is poll.Until.
func WaitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, string)) error {
	return poll.Until(ctx, timeout, what, cond)
}

// Eventually checks cond until it holds, and fails the test with cond's last description after
// timeout. It is poll.Eventually.
func Eventually(t TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	poll.Eventually(t, timeout, what, cond)
}
