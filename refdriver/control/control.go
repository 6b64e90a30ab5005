// Package control is what the reference driver's two modes, simulated (package simulated) and
// real (package plugin), share around their gRPC services: the HTTP control interface that
// lets tests and the demo in other processes break volumes and read what the driver was asked
// (its wire types, its handler over a Backend, its client), the Recorder that counts calls for
// it, the Server that listens on the driver's UNIX sockets and stops within a bound, and the
// Identity defaults of both modes.
//
// The control interface is plain HTTP with JSON bodies, served on a UNIX socket of its own
// (--control). Every mode serves
//
//	GET    /volumes                   every volume                    200 []V
//	GET    /volumes/{id}              one volume                      200 V
//	PUT    /volumes/{id}/condition    break or restore a volume       200 V
//	                                  body {"condition": "hung", "hang": "5s"}
//	PUT    /volumes/{id}/staged       stage or unstage                200 V
//	                                  body {"staged": false}
//	GET    /counters                  call counters                   200 Counters
//	GET    /calls                     the call log, oldest first      200 []Call
//	DELETE /counters                  reset the counters and the log  204
//
// where V is the mode's volume (simulated.Volume, plugin.VolumeStatus). The simulated mode also
// serves POST /volumes, DELETE /volumes/{id} and PUT /volumes/{id}/recheck-after. The condition
// and staged paths are the control endpoint of the Healer protocol's conformance check
// (api/healer/sanity), with its bodies, so that `healerctl sanity --control` breaks volumes in
// either mode without linking this package. Errors answer 400 (bad body or value), 404 (unknown
// volume), 409 (volume exists), 503 (the volume stayed busy) or 500, with the body
// {"error": "..."}. Volume IDs in paths are URL path-escaped.
//
// It must not import the controller's or the sidecar's packages, nor test/, nor either mode.
package control

import (
	"fmt"
	"time"
)

// Condition is the state of a volume's mount that the control interface sets and reports. Its
// values are the names of the conformance check's faults (sanity.Fault).
type Condition string

// The conditions a volume can be put in. What each one does to a volume is the mode's: the
// simulated mode records it, the real mode applies it to a mount.
const (
	// Healthy: the mount works.
	Healthy Condition = "healthy"
	// Gone: the mount vanished, as when a userspace mounter died with the node plugin.
	// Probes report INACCESSIBLE; a heal remounts it.
	Gone Condition = "gone"
	// ReadOnly: the mount turned read-only after I/O errors. Probes report DEGRADED; a heal
	// remounts it read-write.
	ReadOnly Condition = "readonly"
	// Hung: calls that touch the mount block, like calls on a mount whose mounter stopped
	// answering.
	Hung Condition = "hung"
	// Lost: the data is gone for good. Probes report DATA_LOSS; a heal cannot repair it.
	Lost Condition = "lost"
)

// ParseCondition returns the Condition named s, or ErrInvalidRequest.
func ParseCondition(s string) (Condition, error) {
	switch c := Condition(s); c {
	case Healthy, Gone, ReadOnly, Hung, Lost:
		return c, nil
	}
	return "", fmt.Errorf("%w: unknown condition %q (want healthy, gone, readonly, hung or lost)", ErrInvalidRequest, s)
}

// Counters is a snapshot of what a driver has been asked to do since it started or since the
// counters were reset. Tests read it to check budgets: a controller that honours "one action at
// a time per volume" never drives MaxConcurrentPerVolume above 1, and a per-node budget of N
// never drives MaxConcurrent above N.
type Counters struct {
	// Calls counts calls per RPC name ("ProbeVolume", "HealVolume", "ListStagedVolumes",
	// "GetHealerCapabilities", "GetIdentity", "GetCapabilities", "Probe", and in real mode the
	// CSI calls), failed ones included.
	Calls map[string]int64 `json:"calls"`
	// VolumeCalls counts ProbeVolume and HealVolume calls per volume ID, then per RPC name,
	// including calls rejected with ABORTED.
	VolumeCalls map[string]map[string]int64 `json:"volumeCalls"`
	// InFlight is the number of ProbeVolume and HealVolume calls running now.
	InFlight int64 `json:"inFlight"`
	// InFlightPerVolume is InFlight per volume ID; volumes with none are left out.
	InFlightPerVolume map[string]int64 `json:"inFlightPerVolume"`
	// MaxConcurrent is the highest InFlight seen: the most calls this node handled at once.
	MaxConcurrent int64 `json:"maxConcurrent"`
	// MaxConcurrentPerVolume is the highest InFlightPerVolume seen per volume ID. A value above
	// 1 means some caller sent a second call while one was in flight.
	MaxConcurrentPerVolume map[string]int64 `json:"maxConcurrentPerVolume"`
	// Aborted counts calls rejected with ABORTED per volume ID.
	Aborted map[string]int64 `json:"aborted"`
}

// Call is one ProbeVolume or HealVolume call as the driver served it. Counters says how many
// calls ran at once on this driver; the call log says when, so that the calls of several
// drivers, each in its own process on one machine, can be merged into one timeline: how many
// calls a controller had in flight across all nodes at any moment.
type Call struct {
	// RPC is "ProbeVolume" or "HealVolume".
	RPC string `json:"rpc"`
	// VolumeID is the volume the call was for.
	VolumeID string `json:"volumeId"`
	// Start is the wall-clock time the call reached the driver's handler.
	Start time.Time `json:"start"`
	// End is the wall-clock time the call left the handler; zero while it is in flight.
	End time.Time `json:"end"`
	// Abandoned tells that the caller had given up on the call (its deadline had passed, or it
	// cancelled it or went away) when the call ended. The caller no longer counted such a call
	// as in flight from that moment, even if the driver took a little longer to notice.
	Abandoned bool `json:"abandoned,omitempty"`
}

// MaxCallLog bounds the call log: only the most recent calls are kept.
const MaxCallLog = 100_000
