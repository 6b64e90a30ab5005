package sanity

import "errors"

// ErrInvalidOptions is returned by Run when its options cannot start a run (no endpoint, an
// endpoint that is not a UNIX socket, a negative duration).
var ErrInvalidOptions = errors.New("invalid sanity options")
