package driverkit

import "errors"

var (
	// ErrInvalidOptions is returned by Register, NewHealerServer and NewIdentityServer when an
	// option is missing or invalid.
	ErrInvalidOptions = errors.New("invalid options")

	// ErrVolumeNotFound is for Driver.Volume to return (wrapped or as is) for a volume ID the
	// driver does not know at all; the kit answers NOT_FOUND. A volume the driver knows but has
	// not staged on this node is found=false instead, which the kit answers FAILED_PRECONDITION.
	// (An error that carries a gRPC status is relayed with its code as well.)
	ErrVolumeNotFound = errors.New("volume not found")
)
