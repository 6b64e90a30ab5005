package driver

import "errors"

var (
	// ErrInvalidOptions is returned by New and NewServer when an option is missing or invalid.
	ErrInvalidOptions = errors.New("invalid options")

	// ErrVolumeNotFound is returned by the control API for a volume ID the driver does not have.
	ErrVolumeNotFound = errors.New("volume not found")

	// ErrVolumeExists is returned by AddVolume for a volume ID the driver already has.
	ErrVolumeExists = errors.New("volume already exists")

	// ErrInvalidVolume is returned by the control API for an empty volume ID, an unknown
	// condition or a negative duration.
	ErrInvalidVolume = errors.New("invalid volume")

	// ErrState is returned when the state folder cannot be read or written.
	ErrState = errors.New("volume state")

	// ErrControl is returned by ControlClient when the control interface fails in a way none of
	// the other errors describe (an unexpected HTTP status, an answer it cannot decode).
	ErrControl = errors.New("control request failed")
)
