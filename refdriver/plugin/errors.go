package plugin

import "errors"

// The errors of the control API, and of New and NewServer for invalid options, are package
// control's.
var (
	// ErrState is returned when the state folder cannot be read or written.
	ErrState = errors.New("plugin state")

	// ErrMounter is returned when a mounter cannot be started or stopped.
	ErrMounter = errors.New("mounter")
)
