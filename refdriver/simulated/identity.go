package simulated

import (
	"context"

	"github.com/csi-addons/spec/lib/go/identity"
	"google.golang.org/protobuf/types/known/wrapperspb"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// identityServer implements the CSI-Addons Identity service, unchanged from the CSI-Addons
// spec. The one volume-healer addition is the manifest entry that says the driver serves the
// Healer service, since the Identity capabilities have no entry for it.
type identityServer struct {
	identity.UnimplementedIdentityServer
	d *Driver
}

// GetIdentity reports the driver's name and version, and in the manifest the Healer protocol
// version and the node this instance plays.
func (s *identityServer) GetIdentity(context.Context, *identity.GetIdentityRequest) (*identity.GetIdentityResponse, error) {
	s.d.counters.Count("GetIdentity")
	return &identity.GetIdentityResponse{
		Name:          s.d.opts.DriverName,
		VendorVersion: s.d.opts.VendorVersion,
		Manifest: map[string]string{
			healerv1alpha1.IdentityManifestKey: healerv1alpha1.Version,
			"nodeID":                           s.d.opts.NodeID,
		},
	}, nil
}

// GetCapabilities reports NODE_SERVICE: the healer operates on volumes staged on this node.
func (s *identityServer) GetCapabilities(context.Context, *identity.GetCapabilitiesRequest) (*identity.GetCapabilitiesResponse, error) {
	s.d.counters.Count("GetCapabilities")
	return &identity.GetCapabilitiesResponse{
		Capabilities: []*identity.Capability{{
			Type: &identity.Capability_Service_{
				Service: &identity.Capability_Service{Type: identity.Capability_Service_NODE_SERVICE},
			},
		}},
	}, nil
}

// Probe reports the driver ready: its state is loaded before it listens.
func (s *identityServer) Probe(context.Context, *identity.ProbeRequest) (*identity.ProbeResponse, error) {
	s.d.counters.Count("Probe")
	return &identity.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
