package control

import (
	"context"
	"maps"
	"sync"
	"time"
)

// Recorder counts the calls a driver serves and logs its volume calls, for the control
// interface's /counters and /calls. It is safe for concurrent use.
type Recorder struct {
	mu    sync.Mutex
	c     Counters
	calls []*Call
}

// NewRecorder returns a Recorder with every counter at zero.
func NewRecorder() *Recorder {
	r := &Recorder{}
	r.Reset()
	return r
}

// Reset sets every counter back to zero and empties the call log; calls still in flight stay
// counted as in flight.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	inFlight, perVolume := r.c.InFlight, r.c.InFlightPerVolume
	r.c = Counters{
		Calls:                  map[string]int64{},
		VolumeCalls:            map[string]map[string]int64{},
		InFlightPerVolume:      map[string]int64{},
		MaxConcurrentPerVolume: map[string]int64{},
		Aborted:                map[string]int64{},
	}
	// Calls still running stay counted, so that their end does not drive InFlight negative.
	r.c.InFlight = inFlight
	maps.Copy(r.c.InFlightPerVolume, perVolume)
	r.calls = nil
}

// Count counts one call of the RPC rpc.
func (r *Recorder) Count(rpc string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.c.Calls[rpc]++
}

// Enter counts a call of rpc on a volume as in flight, and logs it, until the returned function
// runs. ctx is the call's context: whether it is done when the call ends tells whether the
// caller had given up. Enter does not Count the call.
func (r *Recorder) Enter(ctx context.Context, rpc, volumeID string) (leave func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	call := &Call{RPC: rpc, VolumeID: volumeID, Start: time.Now()}
	if len(r.calls) >= MaxCallLog {
		// Drop the oldest tenth at once, so that a long run copies the log rarely.
		r.calls = append(r.calls[:0], r.calls[MaxCallLog/10:]...)
	}
	r.calls = append(r.calls, call)
	perRPC := r.c.VolumeCalls[volumeID]
	if perRPC == nil {
		perRPC = map[string]int64{}
		r.c.VolumeCalls[volumeID] = perRPC
	}
	perRPC[rpc]++
	r.c.InFlight++
	r.c.MaxConcurrent = max(r.c.MaxConcurrent, r.c.InFlight)
	r.c.InFlightPerVolume[volumeID]++
	r.c.MaxConcurrentPerVolume[volumeID] = max(r.c.MaxConcurrentPerVolume[volumeID], r.c.InFlightPerVolume[volumeID])
	return func() {
		abandoned := ctx.Err() != nil
		end := time.Now()
		r.mu.Lock()
		defer r.mu.Unlock()
		call.End, call.Abandoned = end, abandoned
		r.c.InFlight--
		if r.c.InFlightPerVolume[volumeID]--; r.c.InFlightPerVolume[volumeID] <= 0 {
			delete(r.c.InFlightPerVolume, volumeID)
		}
	}
}

// Aborted counts a call on the volume that was rejected with ABORTED.
func (r *Recorder) Aborted(volumeID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.c.Aborted[volumeID]++
}

// Counters returns a snapshot of the counters.
func (r *Recorder) Counters() Counters {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.c
	s.Calls = maps.Clone(r.c.Calls)
	s.VolumeCalls = make(map[string]map[string]int64, len(r.c.VolumeCalls))
	for id, perRPC := range r.c.VolumeCalls {
		s.VolumeCalls[id] = maps.Clone(perRPC)
	}
	s.InFlightPerVolume = maps.Clone(r.c.InFlightPerVolume)
	s.MaxConcurrentPerVolume = maps.Clone(r.c.MaxConcurrentPerVolume)
	s.Aborted = maps.Clone(r.c.Aborted)
	return s
}

// Calls returns a copy of the call log, oldest first: at most MaxCallLog calls, the most
// recent.
func (r *Recorder) Calls() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Call, len(r.calls))
	for i, c := range r.calls {
		out[i] = *c
	}
	return out
}
