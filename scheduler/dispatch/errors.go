package dispatch

import "errors"

// Errors of the Dispatcher. A Task's Run wraps ErrRetryLater or ErrPermanent to say how its error
// is to be handled; the others reach a Task's Done.
var (
	// ErrRetryLater, wrapped in the error a Task's Run returns, says the driver is busy with the
	// volume (gRPC ABORTED): the call is repeated after the backoff base without counting as a
	// failed attempt, up to Options.MaxBusyRetries times.
	ErrRetryLater = errors.New("volume busy, retry later")
	// ErrPermanent, wrapped in the error a Task's Run returns, says that repeating the call cannot
	// help (gRPC UNIMPLEMENTED): the task ends with that error at once.
	ErrPermanent = errors.New("permanent failure")
	// ErrGaveUp is wrapped, together with the last error, in the result of a task whose calls kept
	// failing (MaxAttempts) or kept finding the volume busy (MaxBusyRetries).
	ErrGaveUp = errors.New("gave up")
	// ErrDispatcherStopped is the result of a task that never ran, or was not retried, because the
	// Dispatcher stopped. Such results wrap context.Canceled too.
	ErrDispatcherStopped = errors.New("dispatcher stopped")
	// ErrDispatcherStarted is returned by a second call of Dispatcher.Start: a Dispatcher runs once.
	ErrDispatcherStarted = errors.New("dispatcher already started")
	// ErrInvalidTask is the result of a Task submitted without a Volume or a Run.
	ErrInvalidTask = errors.New("invalid task")
)
