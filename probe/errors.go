package probe

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Errors of a call to a sidecar, by what the caller should do about them. Classify maps gRPC status
// codes onto them; the original status stays in the chain for messages.
var (
	// ErrBusy: an operation on the volume is in flight (ABORTED). Retry later.
	ErrBusy = errors.New("volume busy")
	// ErrUnsupported: the driver does not implement the call (UNIMPLEMENTED). Never retry.
	ErrUnsupported = errors.New("not supported by the driver")
	// ErrNotStaged: the volume is not staged on that node (FAILED_PRECONDITION). Do not retry
	// until the volume's attachment changes.
	ErrNotStaged = errors.New("volume not staged on the node")
	// ErrNotFound: the sidecar or the driver does not know the volume (NOT_FOUND).
	ErrNotFound = errors.New("volume not found")
	// ErrInvalid: the request was malformed (INVALID_ARGUMENT), a bug on our side. Never retry.
	ErrInvalid = errors.New("invalid request")
	// ErrRejected: the sidecar refused the controller's credentials (UNAUTHENTICATED,
	// PERMISSION_DENIED). Retrying does not help until the configuration changes.
	ErrRejected = errors.New("rejected by the sidecar")
	// ErrUnreachable: the sidecar or its driver cannot be reached (UNAVAILABLE). Retry with backoff.
	ErrUnreachable = errors.New("sidecar or driver unreachable")
	// ErrTimeout: the call did not finish in time (DEADLINE_EXCEEDED). Retry with backoff.
	ErrTimeout = errors.New("call timed out")
	// ErrMalformed: the response breaks the protocol. Retry with backoff; the driver needs fixing.
	ErrMalformed = errors.New("malformed response")
	// ErrListTooLarge: a sidecar's list of its node's staged volumes passed the client's bounds on
	// volumes or bytes. Retry with backoff; the sidecar or its driver needs fixing.
	ErrListTooLarge = errors.New("staged volume list too large")
	// ErrNoEndpoint: the CSIAddonsNode does not say where its sidecar listens.
	ErrNoEndpoint = errors.New("no sidecar endpoint")
	// ErrCall: any other failure of the call (INTERNAL, UNKNOWN, ...). Retry with backoff.
	ErrCall = errors.New("call failed")
	// ErrRefused: the client's Guard refused the call, which was not made: the controller does
	// not hold its leader election Lease now. Retry once it does.
	ErrRefused = errors.New("call refused before it was made")
)

// Classify wraps a gRPC error in the sentinel that says how to handle it. A nil error stays nil.
// This is the one place where status codes are interpreted.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	var kind error
	switch status.Code(err) {
	case codes.Aborted:
		kind = ErrBusy
	case codes.Unimplemented:
		kind = ErrUnsupported
	case codes.FailedPrecondition:
		kind = ErrNotStaged
	case codes.NotFound:
		kind = ErrNotFound
	case codes.InvalidArgument, codes.OutOfRange:
		kind = ErrInvalid
	case codes.Unauthenticated, codes.PermissionDenied:
		kind = ErrRejected
	case codes.Unavailable:
		kind = ErrUnreachable
	case codes.DeadlineExceeded:
		kind = ErrTimeout
	default:
		kind = ErrCall
	}
	return fmt.Errorf("%w: %w", kind, err)
}

// Retryable reports whether a classified error may succeed if the same call is made again later.
func Retryable(err error) bool {
	for _, final := range []error{ErrUnsupported, ErrInvalid, ErrRejected, ErrNotStaged, ErrNotFound, ErrNoEndpoint} {
		if errors.Is(err, final) {
			return false
		}
	}
	return err != nil
}
