package supervisor

import "time"

// MountRequest asks a supervisor to mount a volume and hold it.
type MountRequest struct {
	// Volume is the volume's ID. Required.
	Volume string `json:"volume"`
	// Source is the folder (or any other address) the mounter serves, passed to it as
	// --source. Required.
	Source string `json:"source"`
	// Target is the mount point, such as the volume's staging path; it must be absolute and
	// held by no other volume. Required.
	Target string `json:"target"`
	// FsName is the mount's source in the mount table. Required.
	FsName string `json:"fsName"`
}

// The states of a held volume (VolumeStatus.State).
const (
	// StateRunning: the volume's mounter serves its connection.
	StateRunning = "running"
	// StateRestarting: the mounter died; a new one takes the connection over after a backoff.
	StateRestarting = "restarting"
	// StateFailed: the mounter died more than MaxRestarts times within RestartWindow. The
	// connection is kept (the mount does not die; its requests wait) until a Mount of the
	// volume starts a mounter again, or an Unmount.
	StateFailed = "failed"
	// StateStopped: the mounter was stopped for a handover to a successor.
	StateStopped = "stopped"
)

// VolumeStatus is what a supervisor holds for one volume.
type VolumeStatus struct {
	MountRequest
	// State is one of StateRunning, StateRestarting, StateFailed, StateStopped.
	State string `json:"state"`
	// MounterPID is the running mounter's process ID; 0 when none runs.
	MounterPID int `json:"mounterPid,omitempty"`
	// Restarts counts the mounters started on the connection after the first, by this
	// supervisor and the ones it took the volume over from.
	Restarts int `json:"restarts"`
	// Since is when the volume was mounted.
	Since time.Time `json:"since"`
	// MounterSince is when the running mounter became ready.
	MounterSince time.Time `json:"mounterSince,omitzero"`
	// Connection is the FUSE connection's ID, the folder of the connection under
	// /sys/fs/fuse/connections; 0 when the mount is not in the mount table.
	Connection uint64 `json:"connection,omitempty"`
	// Waiting is the number of requests of the connection that wait for an answer, from its
	// fusectl folder; -1 when it cannot be read (fusectl not mounted).
	Waiting int `json:"waiting"`
	// LastError says why the last mounter stopped or could not start; empty when none did.
	LastError string `json:"lastError,omitempty"`
}

// The states of a supervisor (Status.State).
const (
	// ServerServing: the supervisor holds its volumes and serves its socket.
	ServerServing = "serving"
	// ServerHandedOver: the supervisor handed its volumes to a successor and serves nothing.
	ServerHandedOver = "handed-over"
	// ServerRetired: the supervisor was started again under an instance name that handed its
	// volumes over before; it takes nothing back and serves nothing.
	ServerRetired = "retired"
)

// UnheldMount is a mount of the supervisor's type that it does not hold: its FUSE connection
// belonged to a supervisor that is gone, so it is dead. It is reported, never adopted.
type UnheldMount struct {
	// Target is the mount point.
	Target string `json:"target"`
	// FsName is the mount's source.
	FsName string `json:"fsName"`
	// Connection is the FUSE connection's ID.
	Connection uint64 `json:"connection"`
}

// Status is what a supervisor holds.
type Status struct {
	// Instance is the supervisor's instance name.
	Instance string `json:"instance"`
	// PID is the supervisor's process ID.
	PID int `json:"pid"`
	// State is one of ServerServing, ServerHandedOver, ServerRetired.
	State string `json:"state"`
	// TookOverFrom names the instance the volumes were handed over from; empty when the
	// supervisor started with none to take over.
	TookOverFrom string `json:"tookOverFrom,omitempty"`
	// MaxMounts is the bound on the volumes held.
	MaxMounts int `json:"maxMounts"`
	// Volumes are the volumes held, by ID.
	Volumes []VolumeStatus `json:"volumes"`
	// Unheld are the mounts of the supervisor's type on the node that no supervisor holds.
	Unheld []UnheldMount `json:"unheld,omitempty"`
}
