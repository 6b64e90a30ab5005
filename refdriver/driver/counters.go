package driver

import (
	"context"
	"maps"
	"sync"
	"time"
)

// Counters is a snapshot of what the driver has been asked to do since it started or since
// ResetCounters. Tests read it to check budgets: a controller that honours "one action at a time
// per volume" never drives MaxConcurrentPerVolume above 1, and a per-node budget of N never
// drives MaxConcurrent above N.
type Counters struct {
	// Calls counts calls per RPC name ("ProbeVolume", "HealVolume", "ListStagedVolumes",
	// "GetHealerCapabilities", "GetIdentity", "GetCapabilities", "Probe"), failed ones included.
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

// counters is the live, lock-protected form of Counters, with the call log.
type counters struct {
	mu    sync.Mutex
	c     Counters
	calls []*Call
}

func newCounters() *counters {
	n := &counters{}
	n.reset()
	return n
}

func (n *counters) reset() {
	n.mu.Lock()
	defer n.mu.Unlock()
	inFlight, perVolume := n.c.InFlight, n.c.InFlightPerVolume
	n.c = Counters{
		Calls:                  map[string]int64{},
		VolumeCalls:            map[string]map[string]int64{},
		InFlightPerVolume:      map[string]int64{},
		MaxConcurrentPerVolume: map[string]int64{},
		Aborted:                map[string]int64{},
	}
	// Calls still running stay counted, so that their end does not drive InFlight negative.
	n.c.InFlight = inFlight
	maps.Copy(n.c.InFlightPerVolume, perVolume)
	n.calls = nil
}

// call counts one call of an RPC.
func (n *counters) call(rpc string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.c.Calls[rpc]++
}

// enter counts a volume call as in flight, and logs it, until the returned function runs. ctx
// is the call's context: whether it is done when the call ends tells whether the caller had
// given up.
func (n *counters) enter(ctx context.Context, rpc, volumeID string) (leave func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	call := &Call{RPC: rpc, VolumeID: volumeID, Start: time.Now()}
	if len(n.calls) >= MaxCallLog {
		// Drop the oldest tenth at once, so that a long run copies the log rarely.
		n.calls = append(n.calls[:0], n.calls[MaxCallLog/10:]...)
	}
	n.calls = append(n.calls, call)
	perRPC := n.c.VolumeCalls[volumeID]
	if perRPC == nil {
		perRPC = map[string]int64{}
		n.c.VolumeCalls[volumeID] = perRPC
	}
	perRPC[rpc]++
	n.c.InFlight++
	n.c.MaxConcurrent = max(n.c.MaxConcurrent, n.c.InFlight)
	n.c.InFlightPerVolume[volumeID]++
	n.c.MaxConcurrentPerVolume[volumeID] = max(n.c.MaxConcurrentPerVolume[volumeID], n.c.InFlightPerVolume[volumeID])
	return func() {
		abandoned := ctx.Err() != nil
		end := time.Now()
		n.mu.Lock()
		defer n.mu.Unlock()
		call.End, call.Abandoned = end, abandoned
		n.c.InFlight--
		if n.c.InFlightPerVolume[volumeID]--; n.c.InFlightPerVolume[volumeID] <= 0 {
			delete(n.c.InFlightPerVolume, volumeID)
		}
	}
}

func (n *counters) aborted(volumeID string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.c.Aborted[volumeID]++
}

func (n *counters) snapshot() Counters {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.c
	s.Calls = maps.Clone(n.c.Calls)
	s.VolumeCalls = make(map[string]map[string]int64, len(n.c.VolumeCalls))
	for id, perRPC := range n.c.VolumeCalls {
		s.VolumeCalls[id] = maps.Clone(perRPC)
	}
	s.InFlightPerVolume = maps.Clone(n.c.InFlightPerVolume)
	s.MaxConcurrentPerVolume = maps.Clone(n.c.MaxConcurrentPerVolume)
	s.Aborted = maps.Clone(n.c.Aborted)
	return s
}

// log returns a copy of the call log, oldest first.
func (n *counters) log() []Call {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Call, len(n.calls))
	for i, c := range n.calls {
		out[i] = *c
	}
	return out
}
