package sidecar

import (
	"context"
	"runtime/debug"

	"k8s.io/klog/v2"
)

// Names of the sidecar's own goroutines (those that serve no call), in logs and in
// volume_healer_sidecar_goroutine_panics_total.
const (
	// goroutineRegistration writes the restart marker on the CSIAddonsNode at a start and at
	// each restart of the driver (Sidecar.register).
	goroutineRegistration = "registration"
	// goroutineRegistrationWatch keeps the sidecar's annotations on the CSIAddonsNode
	// (registrar.keep).
	goroutineRegistrationWatch = "registration_watch"
)

// goroutines are the names above, each exposed at 0 from the start.
var goroutines = []string{goroutineRegistration, goroutineRegistrationWatch}

// survive is deferred by a goroutine of the sidecar before its work: it recovers a panic, logs it
// with the goroutine's name and its stack, counts it and calls failed (when set) with the panic's
// value, so that the goroutine's work fails alone and the sidecar, which serves every volume of
// its node, goes on, as recoverPanics does for a call. It must be the deferred function itself:
// recover stops a panic only when called there.
func survive(ctx context.Context, m *Metrics, goroutine string, failed func(r any)) {
	r := recover()
	if r == nil {
		return
	}
	m.goroutinePanicked(goroutine)
	klog.FromContext(ctx).Error(nil, "Goroutine panicked; its work fails, the others go on", "goroutine", goroutine, "panic", r, "stack", string(debug.Stack()))
	if failed != nil {
		failed(r)
	}
}

// supervise runs work until it returns or ctx ends. A panic in work is recovered (survive), and
// work runs again after a backoff (Options.RegisterBackoff, doubling up to
// Options.RegisterMaxBackoff): the goroutine's task lasts as long as the sidecar, and the state
// it left is unknown, so it starts over.
func (s *Sidecar) supervise(ctx context.Context, goroutine string, work func(context.Context)) {
	retries := retryBackoff(s.opts.RegisterBackoff, s.opts.RegisterMaxBackoff)
	for {
		panicked := func() (panicked bool) {
			defer survive(ctx, s.metrics, goroutine, func(any) { panicked = true })
			work(ctx)
			return false
		}()
		if !panicked || ctx.Err() != nil {
			return
		}
		retryIn := retries.Step()
		klog.FromContext(ctx).Info("Starting the goroutine again after its panic", "goroutine", goroutine, "retryIn", retryIn)
		t := s.opts.Clock.NewTimer(retryIn)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}
