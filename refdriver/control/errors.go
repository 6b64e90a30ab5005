package control

import "errors"

var (
	// ErrInvalidOptions is returned by either mode's New and NewServer, and by NewServer and
	// ParseEndpoint here, when an option is missing or invalid.
	ErrInvalidOptions = errors.New("invalid options")

	// ErrVolumeNotFound is returned for a volume ID the driver does not have: by a Backend, and
	// by Client for an answer 404.
	ErrVolumeNotFound = errors.New("volume not found")

	// ErrVolumeExists is returned for a volume ID the simulated driver already has when it is
	// asked to add it: by a Backend, and by Client for an answer 409.
	ErrVolumeExists = errors.New("volume already exists")

	// ErrInvalidRequest is returned for a request the driver cannot carry out as asked (an empty
	// volume ID, an unknown condition, a negative duration, a fault on a volume that is not
	// staged): by a Backend, and by Client for an answer 400.
	ErrInvalidRequest = errors.New("invalid request")

	// ErrBusy is returned when another operation held the volume's lock for longer than the
	// request could wait: by a Backend, and by Client for an answer 503.
	ErrBusy = errors.New("volume busy")
)
