package simulated

import "errors"

// ErrState is returned when the state folder cannot be read or written. The errors of the
// control API, and of New and NewServer for invalid options, are package control's.
var ErrState = errors.New("volume state")
