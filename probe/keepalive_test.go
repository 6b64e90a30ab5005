package probe

import (
	"testing"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// TestKeepaliveFitsTheSidecarsPolicy checks the controller's pings against what a sidecar
// enforces: a client that pings more often than the sidecar's minimum, or without calls in flight
// when the sidecar forbids that, gets GOAWAY (too_many_pings) and loses its connection in the
// middle of a sweep.
func TestKeepaliveFitsTheSidecarsPolicy(t *testing.T) {
	p := clientKeepalive()
	if p.Time == 0 {
		t.Fatal("the controller's connections to sidecars have no keepalive: a sidecar on a node that vanished is found only by each call's timeout")
	}
	if p.Time < healerv1alpha1.KeepaliveMinTime {
		t.Errorf("the controller pings every %s, below the sidecar's enforcement minimum %s: the sidecar would close its connection", p.Time, healerv1alpha1.KeepaliveMinTime)
	}
	if p.PermitWithoutStream && !healerv1alpha1.KeepalivePermitWithoutStream {
		t.Error("the controller pings idle connections, which the sidecar's policy forbids")
	}
	if p.Timeout <= 0 || p.Timeout >= p.Time {
		t.Errorf("ping timeout %s, want above 0 and below the interval %s", p.Timeout, p.Time)
	}
}
