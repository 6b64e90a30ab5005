package driver

import (
	"maps"
	"sync"
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

// counters is the live, lock-protected form of Counters.
type counters struct {
	mu sync.Mutex
	c  Counters
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
}

// call counts one call of an RPC.
func (n *counters) call(rpc string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.c.Calls[rpc]++
}

// enter counts a volume call as in flight until the returned function runs.
func (n *counters) enter(rpc, volumeID string) (leave func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
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
		n.mu.Lock()
		defer n.mu.Unlock()
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
