package control

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/volume-healer/volume-healer/api/healer/sanity"
)

// Client calls the control interface of a driver running in another process; V is the volume
// type the driver's mode answers with (simulated.Volume reads the answers of both modes).
// Errors wrap ErrVolumeNotFound, ErrVolumeExists, ErrInvalidRequest or ErrBusy for the answers
// 404, 409, 400 and 503, so that callers check them as they check the Go API's; any other
// failure wraps sanity.ErrControl.
type Client[V any] struct {
	http *sanity.HTTPControl
}

// NewClient returns a client for the control socket at endpoint ("unix:///path"). Every call
// has a 10 second timeout on top of its context.
func NewClient[V any](endpoint string) (*Client[V], error) {
	h, err := sanity.NewHTTPControl(endpoint)
	if err != nil {
		return nil, err
	}
	return &Client[V]{http: h}, nil
}

// Volumes lists the driver's volumes.
func (c *Client[V]) Volumes(ctx context.Context) ([]V, error) {
	var out []V
	return out, c.Do(ctx, http.MethodGet, "/volumes", nil, &out)
}

// Volume returns one volume.
func (c *Client[V]) Volume(ctx context.Context, id string) (V, error) {
	var out V
	return out, c.Do(ctx, http.MethodGet, sanity.VolumePath(id, ""), nil, &out)
}

// SetCondition breaks or restores a volume; hang applies to Hung.
func (c *Client[V]) SetCondition(ctx context.Context, id string, cond Condition, hang time.Duration) (V, error) {
	var out V
	body := sanity.ConditionRequest{Condition: sanity.Fault(cond), Hang: sanity.Duration(hang)}
	return out, c.Do(ctx, http.MethodPut, sanity.VolumePath(id, "condition"), body, &out)
}

// SetStaged stages or unstages a volume.
func (c *Client[V]) SetStaged(ctx context.Context, id string, staged bool) (V, error) {
	var out V
	return out, c.Do(ctx, http.MethodPut, sanity.VolumePath(id, "staged"), sanity.StagedRequest{Staged: staged}, &out)
}

// Counters reads the call counters.
func (c *Client[V]) Counters(ctx context.Context) (Counters, error) {
	var out Counters
	return out, c.Do(ctx, http.MethodGet, "/counters", nil, &out)
}

// Calls reads the call log.
func (c *Client[V]) Calls(ctx context.Context) ([]Call, error) {
	var out []Call
	return out, c.Do(ctx, http.MethodGet, "/calls", nil, &out)
}

// ResetCounters sets the counters back to zero and empties the call log.
func (c *Client[V]) ResetCounters(ctx context.Context) error {
	return c.Do(ctx, http.MethodDelete, "/counters", nil, nil)
}

// VolumeControl returns the client as the conformance check's sanity.VolumeControl.
func (c *Client[V]) VolumeControl() sanity.VolumeControl {
	return c.http
}

// Do sends one request, body as JSON when not nil, and decodes the answer into into when not
// nil; it maps the interface's error statuses back to this package's sentinel errors.
func (c *Client[V]) Do(ctx context.Context, method, path string, body, into any) error {
	err := c.http.Do(ctx, method, path, body, into)
	var se *sanity.StatusError
	if !errors.As(err, &se) {
		return err
	}
	for _, s := range httpStatus {
		if se.Code == s.status {
			return fmt.Errorf("%w: %w", s.err, se)
		}
	}
	return err
}
