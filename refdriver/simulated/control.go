package simulated

import (
	"context"
	"net/http"
	"time"

	"github.com/volume-healer/volume-healer/api/healer/sanity"
	"github.com/volume-healer/volume-healer/refdriver/control"
)

// The control interface (package control) lets tests in other processes change the driver's
// volumes. Beside the paths every mode serves, the simulated driver serves
//
//	POST   /volumes                     add a volume (body VolumeSpec)     201 Volume
//	DELETE /volumes/{id}                remove a volume                    204
//	PUT    /volumes/{id}/recheck-after  set recheck_after ("0s" clears)    200 Volume
//	                                    body {"recheckAfter": "30s"}

// RecheckAfterRequest is the body of PUT /volumes/{id}/recheck-after.
type RecheckAfterRequest struct {
	// RecheckAfter is returned by later probes and heals; zero clears it.
	RecheckAfter sanity.Duration `json:"recheckAfter"`
}

// ControlHandler returns the HTTP handler of the control interface.
func (d *Driver) ControlHandler() http.Handler {
	mux := control.Handler(controlBackend{d}, d.counters)
	mux.HandleFunc("POST /volumes", func(w http.ResponseWriter, r *http.Request) {
		var spec VolumeSpec
		if !control.Decode(w, r, &spec) {
			return
		}
		v, err := d.AddVolume(spec)
		control.Reply(w, http.StatusCreated, v, err)
	})
	mux.HandleFunc("DELETE /volumes/{id}", func(w http.ResponseWriter, r *http.Request) {
		control.Reply(w, http.StatusNoContent, nil, d.RemoveVolume(r.PathValue("id")))
	})
	mux.HandleFunc("PUT /volumes/{id}/recheck-after", func(w http.ResponseWriter, r *http.Request) {
		var req RecheckAfterRequest
		if !control.Decode(w, r, &req) {
			return
		}
		v, err := d.SetRecheckAfter(r.PathValue("id"), time.Duration(req.RecheckAfter))
		control.Reply(w, http.StatusOK, v, err)
	})
	return mux
}

// controlBackend serves the driver's Go API to the control interface.
type controlBackend struct{ d *Driver }

var _ control.Backend[Volume] = controlBackend{}

func (b controlBackend) Volumes(context.Context) ([]Volume, error) { return b.d.Volumes(), nil }

func (b controlBackend) Volume(_ context.Context, id string) (Volume, error) {
	return b.d.Volume(id)
}

func (b controlBackend) SetCondition(_ context.Context, id string, c control.Condition, hang time.Duration) (Volume, error) {
	return b.d.SetCondition(id, c, hang)
}

func (b controlBackend) SetStaged(_ context.Context, id string, staged bool) (Volume, error) {
	return b.d.SetStaged(id, staged)
}

// ControlClient calls the control interface of a simulated driver running in another process;
// its control.Client part also reads a real-mode driver's volumes, in the fields they share.
type ControlClient struct {
	*control.Client[Volume]
}

// NewControlClient returns a client for the control socket at endpoint ("unix:///path").
// Every call has a 10 second timeout on top of its context.
func NewControlClient(endpoint string) (*ControlClient, error) {
	c, err := control.NewClient[Volume](endpoint)
	if err != nil {
		return nil, err
	}
	return &ControlClient{Client: c}, nil
}

// AddVolume adds a volume.
func (c *ControlClient) AddVolume(ctx context.Context, spec VolumeSpec) (Volume, error) {
	var out Volume
	return out, c.Do(ctx, http.MethodPost, "/volumes", spec, &out)
}

// RemoveVolume removes a volume.
func (c *ControlClient) RemoveVolume(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodDelete, sanity.VolumePath(id, ""), nil, nil)
}

// SetRecheckAfter sets the recheck_after of a volume; zero clears it.
func (c *ControlClient) SetRecheckAfter(ctx context.Context, id string, after time.Duration) (Volume, error) {
	var out Volume
	return out, c.Do(ctx, http.MethodPut, sanity.VolumePath(id, "recheck-after"), RecheckAfterRequest{RecheckAfter: sanity.Duration(after)}, &out)
}
