package sidecarsigner

import "errors"

// ErrInvalidCA reports a CA Secret that does not hold a CA key pair.
var ErrInvalidCA = errors.New("invalid sidecar CA")

// ErrInvalidOptions reports Options that cannot make a Signer.
var ErrInvalidOptions = errors.New("invalid sidecar signer options")
