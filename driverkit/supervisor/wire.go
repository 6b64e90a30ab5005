package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// The operations of the node plugin's socket (request.Op).
const (
	opMount   = "mount"
	opUnmount = "unmount"
	opStatus  = "status"
)

// request is one call on the node plugin's socket: a JSON object, one per connection.
type request struct {
	Op     string        `json:"op"`
	Mount  *MountRequest `json:"mount,omitempty"`
	Volume string        `json:"volume,omitempty"`
}

// response answers a request: Code and Error when it failed, else the call's result.
type response struct {
	Code   string        `json:"code,omitempty"`
	Error  string        `json:"error,omitempty"`
	Volume *VolumeStatus `json:"volume,omitempty"`
	Status *Status       `json:"status,omitempty"`
}

// codes are the sentinel errors a response carries, by their code on the wire.
var codes = map[string]error{
	"invalid-request": ErrInvalidRequest,
	"conflict":        ErrConflict,
	"too-many-mounts": ErrTooManyMounts,
	"mount":           ErrMount,
	"mounter":         ErrMounter,
	"handed-over":     ErrHandedOver,
}

// codeOf is the wire code of err; "internal" when it is none of codes.
func codeOf(err error) string {
	for code, sentinel := range codes {
		if errors.Is(err, sentinel) {
			return code
		}
	}
	return "internal"
}

// errorOf turns a failed response back into an error that wraps the sentinel of its code.
func errorOf(r response) error {
	if sentinel, ok := codes[r.Code]; ok {
		return &remoteError{msg: r.Error, sentinel: sentinel}
	}
	return errors.New(r.Error)
}

// remoteError is an error the supervisor answered: its message, and the sentinel errors.Is
// finds.
type remoteError struct {
	msg      string
	sentinel error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.sentinel }

// serveConn answers the one request of a connection on the node plugin's socket.
func (s *Supervisor) serveConn(ctx context.Context, c net.Conn) {
	defer func() { _ = c.Close() }()
	// A peer that never sends its request does not hold the goroutine forever.
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var req request
	var resp response
	if err := json.NewDecoder(c).Decode(&req); err != nil {
		resp = response{Code: "invalid-request", Error: fmt.Sprintf("read the request: %v", err)}
	} else {
		_ = c.SetReadDeadline(time.Time{})
		resp = s.answer(ctx, req)
	}
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := json.NewEncoder(c).Encode(resp); err != nil {
		s.opts.Logger.Error(err, "Answering a request", "op", req.Op)
	}
}

// answer runs a request.
func (s *Supervisor) answer(ctx context.Context, req request) response {
	fail := func(err error) response { return response{Code: codeOf(err), Error: err.Error()} }
	switch req.Op {
	case opMount:
		if req.Mount == nil {
			return fail(fmt.Errorf("%w: a mount request needs its arguments", ErrInvalidRequest))
		}
		vs, err := s.Mount(ctx, *req.Mount)
		if err != nil {
			return fail(err)
		}
		return response{Volume: &vs}
	case opUnmount:
		if err := s.Unmount(ctx, req.Volume); err != nil {
			return fail(err)
		}
		return response{}
	case opStatus:
		st := s.Status()
		return response{Status: &st}
	default:
		return fail(fmt.Errorf("%w: unknown operation %q: want %s, %s or %s", ErrInvalidRequest, req.Op, opMount, opUnmount, opStatus))
	}
}

// Client calls a supervisor over its socket. The zero value is not usable; make one with
// NewClient.
type Client struct {
	socket  string
	timeout time.Duration
}

// NewClient returns a client of the supervisor serving socket. Each call is bounded by timeout
// (default 60s: a Mount waits for the mounter's ready line, ReadyTimeout), or by its context's
// deadline when earlier.
func NewClient(socket string, timeout time.Duration) *Client {
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	return &Client{socket: socket, timeout: timeout}
}

// Mount asks the supervisor to mount and hold a volume (Supervisor.Mount).
func (c *Client) Mount(ctx context.Context, req MountRequest) (VolumeStatus, error) {
	resp, err := c.call(ctx, request{Op: opMount, Mount: &req})
	if err != nil {
		return VolumeStatus{}, err
	}
	if resp.Volume == nil {
		return VolumeStatus{}, fmt.Errorf("supervisor at %s: its answer to the mount of volume %q has no volume", c.socket, req.Volume)
	}
	return *resp.Volume, nil
}

// Unmount asks the supervisor to let a volume go (Supervisor.Unmount).
func (c *Client) Unmount(ctx context.Context, volumeID string) error {
	_, err := c.call(ctx, request{Op: opUnmount, Volume: volumeID})
	return err
}

// Status asks the supervisor what it holds (Supervisor.Status).
func (c *Client) Status(ctx context.Context) (Status, error) {
	resp, err := c.call(ctx, request{Op: opStatus})
	if err != nil {
		return Status{}, err
	}
	if resp.Status == nil {
		return Status{}, fmt.Errorf("supervisor at %s: its answer has no status", c.socket)
	}
	return *resp.Status, nil
}

func (c *Client) call(ctx context.Context, req request) (response, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return response{}, fmt.Errorf("%w: %s: %w", ErrUnavailable, c.socket, err)
	}
	defer func() { _ = conn.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return response{}, fmt.Errorf("%w: %s: send the %s request: %w", ErrUnavailable, c.socket, req.Op, err)
	}
	var resp response
	if err := json.NewDecoder(conn).Decode(&resp); err != nil {
		return response{}, fmt.Errorf("%w: %s: read the answer to the %s request: %w", ErrUnavailable, c.socket, req.Op, err)
	}
	if resp.Error != "" {
		return resp, errorOf(resp)
	}
	return resp, nil
}
