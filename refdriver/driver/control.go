package driver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// The control interface lets tests in other processes change the driver's volumes. It is plain
// HTTP with JSON bodies, served on its own UNIX socket (--control):
//
//	GET    /volumes                   list volumes                    200 []Volume
//	POST   /volumes                   add a volume (body VolumeSpec)  201 Volume
//	GET    /volumes/{id}              one volume                      200 Volume
//	DELETE /volumes/{id}              remove a volume                 204
//	PUT    /volumes/{id}/condition    break or restore a volume       200 Volume
//	                                  body {"condition": "hung", "hang": "5s"}
//	PUT    /volumes/{id}/staged       stage or unstage                200 Volume
//	                                  body {"staged": false}
//	PUT    /volumes/{id}/recheck-after  set recheck_after ("0s" clears) 200 Volume
//	                                  body {"recheckAfter": "30s"}
//	GET    /counters                  call counters                   200 Counters
//	GET    /calls                     the call log, oldest first      200 []Call
//	DELETE /counters                  reset the counters and the log  204
//
// Errors answer 400 (bad body or value), 404 (unknown volume) or 409 (volume exists) with the
// body {"error": "..."}. Volume IDs in paths are URL path-escaped.

// ConditionRequest is the body of PUT /volumes/{id}/condition.
type ConditionRequest struct {
	// Condition is the new condition.
	Condition Condition `json:"condition"`
	// Hang applies to the hung condition; zero means the driver's default.
	Hang Duration `json:"hang,omitempty"`
}

// StagedRequest is the body of PUT /volumes/{id}/staged.
type StagedRequest struct {
	// Staged is the new staged state.
	Staged bool `json:"staged"`
}

// RecheckAfterRequest is the body of PUT /volumes/{id}/recheck-after.
type RecheckAfterRequest struct {
	// RecheckAfter is returned by later probes and heals; zero clears it.
	RecheckAfter Duration `json:"recheckAfter"`
}

type errorBody struct {
	Error string `json:"error"`
}

// ControlHandler returns the HTTP handler of the control interface.
func (d *Driver) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /volumes", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, d.Volumes())
	})
	mux.HandleFunc("POST /volumes", func(w http.ResponseWriter, r *http.Request) {
		var spec VolumeSpec
		if !readJSON(w, r, &spec) {
			return
		}
		v, err := d.AddVolume(spec)
		reply(w, http.StatusCreated, v, err)
	})
	mux.HandleFunc("GET /volumes/{id}", func(w http.ResponseWriter, r *http.Request) {
		v, err := d.Volume(r.PathValue("id"))
		reply(w, http.StatusOK, v, err)
	})
	mux.HandleFunc("DELETE /volumes/{id}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusNoContent, nil, d.RemoveVolume(r.PathValue("id")))
	})
	mux.HandleFunc("PUT /volumes/{id}/condition", func(w http.ResponseWriter, r *http.Request) {
		var req ConditionRequest
		if !readJSON(w, r, &req) {
			return
		}
		v, err := d.SetCondition(r.PathValue("id"), req.Condition, time.Duration(req.Hang))
		reply(w, http.StatusOK, v, err)
	})
	mux.HandleFunc("PUT /volumes/{id}/staged", func(w http.ResponseWriter, r *http.Request) {
		var req StagedRequest
		if !readJSON(w, r, &req) {
			return
		}
		v, err := d.SetStaged(r.PathValue("id"), req.Staged)
		reply(w, http.StatusOK, v, err)
	})
	mux.HandleFunc("PUT /volumes/{id}/recheck-after", func(w http.ResponseWriter, r *http.Request) {
		var req RecheckAfterRequest
		if !readJSON(w, r, &req) {
			return
		}
		v, err := d.SetRecheckAfter(r.PathValue("id"), time.Duration(req.RecheckAfter))
		reply(w, http.StatusOK, v, err)
	})
	mux.HandleFunc("GET /counters", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, d.Counters())
	})
	mux.HandleFunc("GET /calls", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, d.Calls())
	})
	mux.HandleFunc("DELETE /counters", func(w http.ResponseWriter, _ *http.Request) {
		d.ResetCounters()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

func readJSON(w http.ResponseWriter, r *http.Request, into any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "invalid request body: " + err.Error()})
		return false
	}
	return true
}

func reply(w http.ResponseWriter, okStatus int, body any, err error) {
	switch {
	case err == nil && okStatus == http.StatusNoContent:
		w.WriteHeader(okStatus)
	case err == nil:
		writeJSON(w, okStatus, body)
	case errors.Is(err, ErrVolumeNotFound):
		writeJSON(w, http.StatusNotFound, errorBody{Error: err.Error()})
	case errors.Is(err, ErrVolumeExists):
		writeJSON(w, http.StatusConflict, errorBody{Error: err.Error()})
	case errors.Is(err, ErrInvalidVolume):
		writeJSON(w, http.StatusBadRequest, errorBody{Error: err.Error()})
	default:
		writeJSON(w, http.StatusInternalServerError, errorBody{Error: err.Error()})
	}
}

func writeJSON(w http.ResponseWriter, code int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

// ControlClient calls the control interface of a driver running in another process.
type ControlClient struct {
	http *http.Client
}

// NewControlClient returns a client for the control socket at endpoint ("unix:///path").
// Every call has a 10 second timeout on top of its context.
func NewControlClient(endpoint string) (*ControlClient, error) {
	path, err := ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	return &ControlClient{http: &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", path)
			},
		},
	}}, nil
}

// Volumes lists the driver's volumes.
func (c *ControlClient) Volumes(ctx context.Context) ([]Volume, error) {
	var out []Volume
	return out, c.do(ctx, http.MethodGet, "/volumes", nil, &out)
}

// Volume returns one volume.
func (c *ControlClient) Volume(ctx context.Context, id string) (Volume, error) {
	var out Volume
	return out, c.do(ctx, http.MethodGet, volumePath(id, ""), nil, &out)
}

// AddVolume adds a volume.
func (c *ControlClient) AddVolume(ctx context.Context, spec VolumeSpec) (Volume, error) {
	var out Volume
	return out, c.do(ctx, http.MethodPost, "/volumes", spec, &out)
}

// RemoveVolume removes a volume.
func (c *ControlClient) RemoveVolume(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, volumePath(id, ""), nil, nil)
}

// SetCondition breaks or restores a volume; hang applies to Hung.
func (c *ControlClient) SetCondition(ctx context.Context, id string, cond Condition, hang time.Duration) (Volume, error) {
	var out Volume
	return out, c.do(ctx, http.MethodPut, volumePath(id, "condition"), ConditionRequest{Condition: cond, Hang: Duration(hang)}, &out)
}

// SetStaged stages or unstages a volume.
func (c *ControlClient) SetStaged(ctx context.Context, id string, staged bool) (Volume, error) {
	var out Volume
	return out, c.do(ctx, http.MethodPut, volumePath(id, "staged"), StagedRequest{Staged: staged}, &out)
}

// SetRecheckAfter sets the recheck_after of a volume; zero clears it.
func (c *ControlClient) SetRecheckAfter(ctx context.Context, id string, after time.Duration) (Volume, error) {
	var out Volume
	return out, c.do(ctx, http.MethodPut, volumePath(id, "recheck-after"), RecheckAfterRequest{RecheckAfter: Duration(after)}, &out)
}

// Counters reads the call counters.
func (c *ControlClient) Counters(ctx context.Context) (Counters, error) {
	var out Counters
	return out, c.do(ctx, http.MethodGet, "/counters", nil, &out)
}

// Calls reads the call log.
func (c *ControlClient) Calls(ctx context.Context) ([]Call, error) {
	var out []Call
	return out, c.do(ctx, http.MethodGet, "/calls", nil, &out)
}

// ResetCounters sets the counters back to zero and empties the call log.
func (c *ControlClient) ResetCounters(ctx context.Context) error {
	return c.do(ctx, http.MethodDelete, "/counters", nil, nil)
}

func volumePath(id, sub string) string {
	p := "/volumes/" + url.PathEscape(id)
	if sub != "" {
		p += "/" + sub
	}
	return p
}

// do sends one request and maps the control interface's error statuses back to the sentinel
// errors that the Go API returns, so that callers check both the same way.
func (c *ControlClient) do(ctx context.Context, method, path string, body, into any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("control %s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	// The host is ignored: the transport always dials the control socket.
	req, err := http.NewRequestWithContext(ctx, method, "http://refdriver"+path, rd)
	if err != nil {
		return fmt.Errorf("control %s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("control %s %s: %w", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode >= 300 {
		var eb errorBody
		_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&eb)
		var sentinel error
		switch resp.StatusCode {
		case http.StatusNotFound:
			sentinel = ErrVolumeNotFound
		case http.StatusConflict:
			sentinel = ErrVolumeExists
		case http.StatusBadRequest:
			sentinel = ErrInvalidVolume
		default:
			sentinel = ErrControl
		}
		return fmt.Errorf("control %s %s: %w (HTTP %d: %s)", method, path, sentinel, resp.StatusCode, eb.Error)
	}
	if into == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		return fmt.Errorf("control %s %s: %w: decode answer: %w", method, path, ErrControl, err)
	}
	return nil
}
