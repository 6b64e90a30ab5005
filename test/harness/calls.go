package harness

import (
	"context"
	"path"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// DriverCalls keeps the last request of each driver RPC as the driver received it: its Intercept
// goes in DriverServerOptions.Interceptors. It is safe for concurrent use.
type DriverCalls struct {
	mu   sync.Mutex
	last map[string]proto.Message
	// first is when each RPC was first received.
	first map[string]time.Time
}

// Intercept records req under its RPC's name and passes the call on.
func (c *DriverCalls) Intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if m, ok := req.(proto.Message); ok {
		c.mu.Lock()
		if c.last == nil {
			c.last, c.first = map[string]proto.Message{}, map[string]time.Time{}
		}
		rpc := path.Base(info.FullMethod)
		c.last[rpc] = proto.Clone(m)
		if _, ok := c.first[rpc]; !ok {
			c.first[rpc] = time.Now()
		}
		c.mu.Unlock()
	}
	return handler(ctx, req)
}

// Last returns the last request of the RPC rpc ("ProbeVolume"); nil before the first.
func (c *DriverCalls) Last(rpc string) proto.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last[rpc]
}

// First returns when the RPC rpc ("GetIdentity") was first received; zero before then.
func (c *DriverCalls) First(rpc string) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.first[rpc]
}

// Probe returns the last ProbeVolume request; nil before the first.
func (c *DriverCalls) Probe() *healerv1alpha1.ProbeVolumeRequest {
	m, _ := c.Last("ProbeVolume").(*healerv1alpha1.ProbeVolumeRequest)
	return m
}

// Heal returns the last HealVolume request; nil before the first.
func (c *DriverCalls) Heal() *healerv1alpha1.HealVolumeRequest {
	m, _ := c.Last("HealVolume").(*healerv1alpha1.HealVolumeRequest)
	return m
}
