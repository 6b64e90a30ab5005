package plugin

import "errors"

var (
	// ErrInvalidOptions is returned by New and NewServer when an option is missing or invalid.
	ErrInvalidOptions = errors.New("invalid options")

	// ErrVolumeNotFound is returned by the control API for a volume the plugin does not have.
	ErrVolumeNotFound = errors.New("volume not found")

	// ErrInvalidRequest is returned by the control API for a request it cannot carry out as
	// asked: an unknown condition, a negative duration, a fault on a volume that is not staged.
	ErrInvalidRequest = errors.New("invalid request")

	// ErrBusy is returned by the control API when another operation held the volume's lock for
	// longer than the request could wait.
	ErrBusy = errors.New("volume busy")

	// ErrState is returned when the state folder cannot be read or written.
	ErrState = errors.New("plugin state")

	// ErrMounter is returned when a mounter cannot be started or stopped.
	ErrMounter = errors.New("mounter")
)
