package healer

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler/dispatch"
)

// How a sidecar call's error reaches the dispatcher decides whether it is retried, and under
// which reason the retry is counted.
func TestDispatchError(t *testing.T) {
	tests := map[string]struct {
		err                          error
		later, permanent, timeoutish bool
	}{
		"busy volume":         {err: fmt.Errorf("%w: ABORTED", probe.ErrBusy), later: true},
		"call timed out":      {err: fmt.Errorf("%w: DEADLINE_EXCEEDED", probe.ErrTimeout), timeoutish: true},
		"sidecar unreachable": {err: fmt.Errorf("%w: connection refused", probe.ErrUnreachable)},
		"not supported":       {err: fmt.Errorf("%w: UNIMPLEMENTED", probe.ErrUnsupported), permanent: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := dispatchError(tc.err)
			if !errors.Is(got, tc.err) {
				t.Errorf("%v lost the original error", got)
			}
			if errors.Is(got, dispatch.ErrRetryLater) != tc.later || errors.Is(got, dispatch.ErrPermanent) != tc.permanent ||
				errors.Is(got, context.DeadlineExceeded) != tc.timeoutish {
				t.Errorf("dispatchError(%v) = %v: retry later %v, permanent %v, deadline %v; want %v, %v, %v", tc.err, got,
					errors.Is(got, dispatch.ErrRetryLater), errors.Is(got, dispatch.ErrPermanent), errors.Is(got, context.DeadlineExceeded),
					tc.later, tc.permanent, tc.timeoutish)
			}
		})
	}
}
