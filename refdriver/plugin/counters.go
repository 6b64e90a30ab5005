package plugin

import (
	"context"
	"path"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// volumeRPCs are the calls counted per volume and logged, as the simulated driver does.
var volumeRPCs = map[string]bool{"ProbeVolume": true, "HealVolume": true}

// countCalls counts every call by its method name in the plugin's control.Recorder; ProbeVolume
// and HealVolume also per volume, in flight, in the call log, and as ABORTED when they were.
func (p *Plugin) countCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	rpc := path.Base(info.FullMethod)
	p.counters.Count(rpc)
	v, ok := req.(interface{ GetVolumeId() string })
	if !volumeRPCs[rpc] || !ok || v.GetVolumeId() == "" {
		return handler(ctx, req)
	}
	leave := p.counters.Enter(ctx, rpc, v.GetVolumeId())
	defer leave()
	resp, err := handler(ctx, req)
	if status.Code(err) == codes.Aborted {
		p.counters.Aborted(v.GetVolumeId())
	}
	return resp, err
}
