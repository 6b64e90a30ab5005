package sidecar

import (
	"testing"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// TestServerKeepaliveAndStreamCap checks the limits the NodeHealer server is built with: the
// enforcement policy the controller's pings are made to fit, pings of its own to find a controller
// that vanished, and a cap on the calls one connection may have in flight.
func TestServerKeepaliveAndStreamCap(t *testing.T) {
	s := serverLimits()
	if s.enforcement.MinTime != healerv1alpha1.KeepaliveMinTime || s.enforcement.PermitWithoutStream != healerv1alpha1.KeepalivePermitWithoutStream {
		t.Errorf("enforcement policy %+v, want MinTime %s and PermitWithoutStream %t as the protocol says",
			s.enforcement, healerv1alpha1.KeepaliveMinTime, healerv1alpha1.KeepalivePermitWithoutStream)
	}
	if s.params.Time <= 0 || s.params.Timeout <= 0 {
		t.Errorf("server keepalive %+v: a controller that vanished would hold its connection for hours", s.params)
	}
	if s.maxStreams == 0 || s.maxStreams > healerv1alpha1.MaxConcurrentStreams {
		t.Errorf("streams per connection capped at %d, want 1..%d", s.maxStreams, healerv1alpha1.MaxConcurrentStreams)
	}
	if len(s.options()) != 3 {
		t.Errorf("%d server options from the limits, want 3 (enforcement, parameters, stream cap)", len(s.options()))
	}
}
