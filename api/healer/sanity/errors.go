package sanity

import "errors"

var (
	// ErrInvalidOptions is returned by Run when its options cannot start a run (no endpoint, an
	// endpoint that is not a UNIX socket, a negative duration), and by NewHTTPControl for an
	// endpoint that is not a UNIX socket.
	ErrInvalidOptions = errors.New("invalid sanity options")

	// ErrControl is wrapped by the errors of HTTPControl: the control endpoint could not be
	// reached, refused the request (StatusError), or answered with a body that does not decode.
	ErrControl = errors.New("control request failed")
)
