package propagation

import "errors"

// ErrNotFound is returned by Objects when an object the pod names does not exist (yet): a claim
// created a moment after its pod, or a PersistentVolume deleted under its claim.
var ErrNotFound = errors.New("not found")
