package sidecar

import "errors"

var (
	// ErrInvalidOptions is returned by New when an option is missing or invalid.
	ErrInvalidOptions = errors.New("invalid sidecar options")

	// ErrNotReady means the sidecar cannot answer now: the driver has not answered GetIdentity
	// and GetHealerCapabilities since the sidecar started, or the API server did not answer a
	// read of the volume's PersistentVolume or VolumeAttachment. Callers get UNAVAILABLE and
	// retry.
	ErrNotReady = errors.New("sidecar not ready")

	// ErrDriverIdentity is returned when the driver's CSI-Addons identity is unusable (an empty
	// driver name).
	ErrDriverIdentity = errors.New("invalid driver identity")

	// ErrPVNotFound means no PersistentVolume of the requested name exists.
	ErrPVNotFound = errors.New("PersistentVolume not found")

	// ErrNotCSIVolume means the PersistentVolume has no spec.csi: it is not a CSI volume.
	ErrNotCSIVolume = errors.New("PersistentVolume is not a CSI volume")

	// ErrOtherDriver means the PersistentVolume belongs to a CSI driver other than the one
	// behind this sidecar.
	ErrOtherDriver = errors.New("PersistentVolume belongs to another driver")

	// ErrInvalidRequest means a NodeHealer request is malformed (an empty pv_name, a negative
	// max_entries).
	ErrInvalidRequest = errors.New("invalid request")

	// ErrNotOnNode means the PersistentVolume is neither attached to the sidecar's node (no
	// attached VolumeAttachment of its driver there) nor recorded by kubelet as staged or
	// published there, nor listed by the driver as staged on it: the sidecar acts only on its own
	// node's volumes. Callers get FAILED_PRECONDITION.
	ErrNotOnNode = errors.New("PersistentVolume not on this node")

	// ErrSecretNotFound means the node-stage Secret a PersistentVolume names does not exist.
	ErrSecretNotFound = errors.New("node-stage Secret not found")

	// ErrSecretsUnavailable means the node-stage Secret could not be read, typically because the
	// sidecar may not get Secrets in its namespace.
	ErrSecretsUnavailable = errors.New("node-stage Secrets not readable")

	// ErrNotAdvertised means the driver does not advertise the Healer RPC that was asked for, or
	// does not serve the Healer service at all.
	ErrNotAdvertised = errors.New("not advertised by the driver")

	// ErrMalformedResponse means the driver answered with a response that breaks a MUST of the
	// protocol (docs/protocol.md), so the sidecar does not relay it.
	ErrMalformedResponse = errors.New("malformed response from the driver")

	// ErrNoContainerRuntime means the sidecar was given no container runtime socket
	// (ContainerRuntimeEndpoint), so it cannot restart containers. Callers get UNIMPLEMENTED.
	ErrNoContainerRuntime = errors.New("no access to the container runtime")

	// ErrCSIAddonsNodeConflict means the CSIAddonsNode the sidecar would update describes another
	// driver or node; the sidecar leaves it alone.
	ErrCSIAddonsNodeConflict = errors.New("CSIAddonsNode belongs to another driver or node")
)
