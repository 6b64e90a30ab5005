package sanity

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// The control endpoint is how the checks that need a broken volume break it in a driver that
// runs in another process (`healerctl sanity --control`). It is not part of the Healer
// protocol; a driver serves it in its test builds only, on a UNIX socket of its own, as plain
// HTTP with JSON bodies:
//
//	PUT /volumes/{id}/condition   put the volume in a fault, or restore it    2xx
//	                              body ConditionRequest: {"condition": "hung", "hang": "5s"}
//	PUT /volumes/{id}/staged      unstage the volume, or stage it again       2xx
//	                              body StagedRequest: {"staged": false}
//
// {id} is the volume ID, URL path-escaped. The condition is a Fault's name ("healthy", "gone",
// "readonly", "hung", "lost"); "hang" is a Go duration and applies to "hung" only. A success
// answers any 2xx status; the answer's body is not read. A failure answers 400 (a body, fault or
// duration the driver cannot take), 404 (an unknown volume), or another status of 300 or more,
// with the body ErrorBody: {"error": "what went wrong"}. The reference driver
// (refdriver/control) serves these paths, with more of its own beside them.

// ConditionRequest is the body of PUT /volumes/{id}/condition.
type ConditionRequest struct {
	// Condition is the fault to put the volume in; Healthy restores it.
	Condition Fault `json:"condition"`
	// Hang is how long calls that touch the volume block, for Hung; zero leaves it to the
	// driver.
	Hang Duration `json:"hang,omitempty"`
}

// StagedRequest is the body of PUT /volumes/{id}/staged.
type StagedRequest struct {
	// Staged is whether the volume is to be staged on the driver's node.
	Staged bool `json:"staged"`
}

// ErrorBody is the body of a failed request to the control endpoint.
type ErrorBody struct {
	// Error says what went wrong.
	Error string `json:"error"`
}

// Duration is a time.Duration that reads and writes JSON as a Go duration string ("2.5s").
type Duration time.Duration

// MarshalJSON writes the duration as a string such as "1m30s".
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a duration string such as "1m30s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"2s\": %w", err)
	}
	parsed, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	*d = Duration(parsed)
	return nil
}

// VolumePath is the control endpoint's path of a volume, "/volumes/{id}", followed by
// "/"+sub when sub is not empty.
func VolumePath(id, sub string) string {
	p := "/volumes/" + url.PathEscape(id)
	if sub != "" {
		p += "/" + sub
	}
	return p
}

// HTTPControl is the VolumeControl of a driver that serves the control endpoint.
type HTTPControl struct {
	endpoint string
	http     *http.Client
}

var _ VolumeControl = (*HTTPControl)(nil)

// NewHTTPControl returns a client of the control endpoint served on the UNIX socket at endpoint
// ("unix:///path", or a bare absolute path). Every request has a 10 second timeout on top of its
// context.
func NewHTTPControl(endpoint string) (*HTTPControl, error) {
	path, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok {
		path = endpoint
	}
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("%w: control endpoint %q must look like unix:///path/to/control.sock", ErrInvalidOptions, endpoint)
	}
	return &HTTPControl{endpoint: endpoint, http: &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", path)
			},
		},
	}}, nil
}

// SetFault puts the volume volumeID in fault f; hang is how long calls block for Hung.
func (c *HTTPControl) SetFault(ctx context.Context, volumeID string, f Fault, hang time.Duration) error {
	return c.Do(ctx, http.MethodPut, VolumePath(volumeID, "condition"), ConditionRequest{Condition: f, Hang: Duration(hang)}, nil)
}

// SetStaged stages or unstages the volume volumeID on the driver's node.
func (c *HTTPControl) SetStaged(ctx context.Context, volumeID string, staged bool) error {
	return c.Do(ctx, http.MethodPut, VolumePath(volumeID, "staged"), StagedRequest{Staged: staged}, nil)
}

// StatusError is the error of a request that the control endpoint answered with a status of
// 300 or more. It matches ErrControl with errors.Is.
type StatusError struct {
	// Method and Path are the request's.
	Method, Path string
	// Code is the HTTP status of the answer.
	Code int
	// Message is the answer's ErrorBody.Error, or empty when the body had none.
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("control %s %s: HTTP %d: %s", e.Method, e.Path, e.Code, e.Message)
}

// Unwrap returns ErrControl.
func (e *StatusError) Unwrap() error { return ErrControl }

// Do sends one request to the control endpoint: body, when not nil, as JSON; the answer's JSON
// into into, when not nil. An answer of status 300 or more is a *StatusError; a request that got
// no answer, or an answer that does not decode, wraps ErrControl too.
func (c *HTTPControl) Do(ctx context.Context, method, path string, body, into any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("%w: %s %s: encode body: %w", ErrControl, method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	// The host is ignored: the transport always dials the control socket.
	req, err := http.NewRequestWithContext(ctx, method, "http://control"+path, rd)
	if err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrControl, method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %s %s on %s: %w", ErrControl, method, path, c.endpoint, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode >= 300 {
		var eb ErrorBody
		_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&eb)
		return &StatusError{Method: method, Path: path, Code: resp.StatusCode, Message: eb.Error}
	}
	if into == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		return fmt.Errorf("%w: %s %s: decode answer: %w", ErrControl, method, path, err)
	}
	return nil
}
