package trigger

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// waitForWork blocks until wake receives, wait has passed (never, when wait is 0 or less) or ctx
// ends; it reports whether ctx is still live. The restart and manual triggers' loops sleep in it
// between two rounds of handing out sweeps.
func waitForWork(ctx context.Context, clk clock.Clock, wait time.Duration, wake <-chan struct{}) bool {
	var fire <-chan time.Time
	if wait > 0 {
		timer := clk.NewTimer(wait)
		defer timer.Stop()
		fire = timer.C()
	}
	select {
	case <-ctx.Done():
		return false
	case <-wake:
	case <-fire:
	}
	return true
}
