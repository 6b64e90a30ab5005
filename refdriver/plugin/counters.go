package plugin

import (
	"context"
	"maps"
	"path"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/volume-healer/volume-healer/refdriver/driver"
)

// counters counts the calls the plugin serves, in the simulated driver's shapes
// (driver.Counters, driver.Call), so that the control interface answers both modes alike.
type counters struct {
	mu    sync.Mutex
	c     driver.Counters
	calls []*driver.Call
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
	n.c = driver.Counters{
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

// volumeRPCs are the calls counted per volume and logged, as the simulated driver does.
var volumeRPCs = map[string]bool{"ProbeVolume": true, "HealVolume": true}

// interceptor counts every call by its method name; ProbeVolume and HealVolume also per volume,
// in flight, in the call log, and as ABORTED when they were.
func (n *counters) interceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		rpc := path.Base(info.FullMethod)
		v, ok := req.(interface{ GetVolumeId() string })
		if !volumeRPCs[rpc] || !ok || v.GetVolumeId() == "" {
			n.count(rpc)
			return handler(ctx, req)
		}
		leave := n.enter(ctx, rpc, v.GetVolumeId())
		resp, err := handler(ctx, req)
		leave(status.Code(err) == codes.Aborted)
		return resp, err
	}
}

func (n *counters) count(rpc string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.c.Calls[rpc]++
}

func (n *counters) enter(ctx context.Context, rpc, volumeID string) (leave func(aborted bool)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.c.Calls[rpc]++
	call := &driver.Call{RPC: rpc, VolumeID: volumeID, Start: time.Now()}
	if len(n.calls) >= driver.MaxCallLog {
		// Drop the oldest tenth at once, so that a long run copies the log rarely.
		n.calls = append(n.calls[:0], n.calls[driver.MaxCallLog/10:]...)
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
	return func(aborted bool) {
		abandoned := ctx.Err() != nil
		end := time.Now()
		n.mu.Lock()
		defer n.mu.Unlock()
		call.End, call.Abandoned = end, abandoned
		n.c.InFlight--
		if n.c.InFlightPerVolume[volumeID]--; n.c.InFlightPerVolume[volumeID] <= 0 {
			delete(n.c.InFlightPerVolume, volumeID)
		}
		if aborted {
			n.c.Aborted[volumeID]++
		}
	}
}

func (n *counters) snapshot() driver.Counters {
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

func (n *counters) log() []driver.Call {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]driver.Call, len(n.calls))
	for i, c := range n.calls {
		out[i] = *c
	}
	return out
}
