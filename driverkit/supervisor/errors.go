package supervisor

import "errors"

// The errors of the supervisor, checked with errors.Is. A Client returns the same errors for
// the answers of a supervisor on the other end of its socket.
var (
	// ErrInvalidOptions is returned by New for missing or invalid options.
	ErrInvalidOptions = errors.New("invalid supervisor options")

	// ErrInvalidRequest is returned for a Mount or Unmount whose arguments are missing or
	// malformed.
	ErrInvalidRequest = errors.New("invalid request")

	// ErrConflict is returned by Mount for a volume that is held already with other arguments
	// (source, target or fsname), and for a target that another volume holds.
	ErrConflict = errors.New("conflicting mount")

	// ErrTooManyMounts is returned by Mount when the supervisor holds Options.MaxMounts
	// volumes already.
	ErrTooManyMounts = errors.New("too many mounts")

	// ErrMount is returned when the FUSE mount of a volume cannot be made or taken down.
	ErrMount = errors.New("mount")

	// ErrMounter is returned when a volume's mounter cannot be started, did not become ready
	// in time, or cannot be stopped.
	ErrMounter = errors.New("mounter")

	// ErrHandedOver is returned for any call to a supervisor that handed its mounts to a
	// successor: it serves nothing any more and waits to be stopped.
	ErrHandedOver = errors.New("handed over to a successor")

	// ErrHandover is returned when the handover of the mounts from a running supervisor
	// fails.
	ErrHandover = errors.New("handover")

	// ErrUnavailable is returned by a Client that cannot reach the supervisor's socket.
	ErrUnavailable = errors.New("supervisor unavailable")
)
