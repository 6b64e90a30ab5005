package restart

import "errors"

var (
	// ErrInvalidOptions is returned by New when an option is missing or invalid.
	ErrInvalidOptions = errors.New("invalid container runtime options")

	// ErrInvalidTarget means a Target is malformed: an empty or relative publish target, or a pod
	// UID that is empty or not a single path element.
	ErrInvalidTarget = errors.New("invalid restart target")

	// ErrBusy means a restart of the containers of the same pod for the same publish target is in
	// flight.
	ErrBusy = errors.New("a restart of these containers is in flight")

	// ErrNoContainer means no running container of the pod mounts the publish target: there is
	// nothing to restart.
	ErrNoContainer = errors.New("no running container of the pod mounts the volume")

	// ErrUnreachable means the container runtime could not be reached, or does not serve the CRI
	// runtime service (v1).
	ErrUnreachable = errors.New("container runtime unreachable")

	// ErrTimeout means the container runtime did not answer within the call's deadline.
	ErrTimeout = errors.New("container runtime did not answer in time")

	// ErrRuntime means the container runtime answered a call with an error of its own.
	ErrRuntime = errors.New("container runtime error")
)
