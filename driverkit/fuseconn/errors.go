package fuseconn

import "errors"

// ErrInvalidOptions is returned for missing or invalid MountOptions or Options.
var ErrInvalidOptions = errors.New("invalid fuseconn options")

// ErrState is returned when a state directory cannot be read back for a takeover: it is missing,
// or its journal is corrupt or from another connection.
var ErrState = errors.New("unusable FUSE session state")

// ErrUnmounted is returned by Session.Serve when the connection ended under it: the file system
// was unmounted or the connection aborted.
var ErrUnmounted = errors.New("the FUSE connection ended")

// ErrProtocol is returned when the kernel speaks a FUSE protocol the session does not.
var ErrProtocol = errors.New("unsupported FUSE protocol")
