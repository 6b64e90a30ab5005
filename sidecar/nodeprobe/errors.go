package nodeprobe

import "errors"

var (
	// ErrNotOnNode means kubelet records neither a staging path nor a publish target of the
	// volume on this node.
	ErrNotOnNode = errors.New("volume not on this node by kubelet's records")

	// ErrBadRecord means one of kubelet's records is missing where kubelet always keeps one, or
	// cannot be read; the message names the file.
	ErrBadRecord = errors.New("unreadable kubelet volume record")

	// ErrInvalidVolume means a request names no driver, volume handle or PersistentVolume, or
	// one that cannot be a path element.
	ErrInvalidVolume = errors.New("invalid volume")

	// ErrNotProbed means the volume is on the node but nothing of it can be probed here: a raw
	// block volume that kubelet published for no pod (its staging folder is the driver's own).
	ErrNotProbed = errors.New("volume not probed")

	// ErrStatBusy means as many stat processes as allowed are still running (a frozen mount
	// keeps one each until its deadline); the check is refused rather than queued.
	ErrStatBusy = errors.New("too many mount stats in flight")
)
