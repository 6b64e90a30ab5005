package leader

import "errors"

// ErrNotHeld is returned for a call refused, or a release not made, because this replica does
// not hold the Lease: it never took it, the time it is known to hold it has passed, or its
// leadership ended.
var ErrNotHeld = errors.New("this replica does not hold the leader election Lease")
