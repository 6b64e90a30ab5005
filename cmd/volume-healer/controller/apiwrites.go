package controller

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// apiWriteTimeout bounds each of the controller's own writes to the API server (the handled
// markers, the claims' status annotations): a merge patch takes milliseconds, and a write that
// hangs would otherwise hold its sweep until the API server's own request timeout, or forever on a
// connection that stopped answering without closing. Half the API server's default request
// timeout (60s), so the API server's queueing under load still fits.
const apiWriteTimeout = 30 * time.Second

// boundedWrites is the controller's API client with a deadline on every write: the one of the
// caller's context when it is sooner, else timeout. Reads, lists and watches are not bounded: the
// informers' watches are long-running by design, which is why rest.Config.Timeout (it would end
// them too) is not used.
type boundedWrites struct {
	client.WithWatch
	timeout time.Duration
}

var _ client.WithWatch = boundedWrites{}

// boundWrites returns c with every write bounded by timeout.
func boundWrites(c client.WithWatch, timeout time.Duration) client.WithWatch {
	return boundedWrites{WithWatch: c, timeout: timeout}
}

// Create creates obj within the write timeout.
func (b boundedWrites) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.WithWatch.Create(ctx, obj, opts...)
}

// Update updates obj within the write timeout.
func (b boundedWrites) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.WithWatch.Update(ctx, obj, opts...)
}

// Patch patches obj within the write timeout.
func (b boundedWrites) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.WithWatch.Patch(ctx, obj, patch, opts...)
}

// Delete deletes obj within the write timeout.
func (b boundedWrites) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.WithWatch.Delete(ctx, obj, opts...)
}

// DeleteAllOf deletes the objects of obj's kind within the write timeout.
func (b boundedWrites) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.WithWatch.DeleteAllOf(ctx, obj, opts...)
}
