package cli

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csi-addons/spec/lib/go/identity"
	"google.golang.org/grpc"

	"github.com/volume-healer/volume-healer/api/healer/sanity"
	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
)

// stockIdentity is the CSI-Addons Identity of a driver that has not adopted the Healer protocol:
// it announces nothing of it.
type stockIdentity struct {
	identity.UnimplementedIdentityServer
}

func (stockIdentity) GetIdentity(context.Context, *identity.GetIdentityRequest) (*identity.GetIdentityResponse, error) {
	return &identity.GetIdentityResponse{Name: "rbd.csi.ceph.com", VendorVersion: "v3.12.2"}, nil
}

func (stockIdentity) GetCapabilities(context.Context, *identity.GetCapabilitiesRequest) (*identity.GetCapabilitiesResponse, error) {
	return &identity.GetCapabilitiesResponse{Capabilities: []*identity.Capability{{
		Type: &identity.Capability_Service_{Service: &identity.Capability_Service{Type: identity.Capability_Service_NODE_SERVICE}},
	}}}, nil
}

func (stockIdentity) Probe(context.Context, *identity.ProbeRequest) (*identity.ProbeResponse, error) {
	return &identity.ProbeResponse{}, nil
}

// serveDriver serves id and, unless nil, h on a UNIX socket and returns its endpoint.
func serveDriver(t *testing.T, id identity.IdentityServer, h healerv1alpha1.HealerServer) string {
	t.Helper()
	// Short on purpose: UNIX socket paths must stay under 108 bytes.
	dir, err := os.MkdirTemp("", "ctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	lis, err := net.Listen("unix", filepath.Join(dir, "csi-addons.sock"))
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	identity.RegisterIdentityServer(s, id)
	if h != nil {
		healerv1alpha1.RegisterHealerServer(s, h)
	}
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return "unix://" + lis.Addr().String()
}

// TestSanityPrintsTier runs `healerctl sanity` against drivers of each tier: it says which tier the
// driver gets, and a driver that serves no Healer service passes instead of failing.
func TestSanityPrintsTier(t *testing.T) {
	tests := map[string]struct {
		driver   func(t *testing.T) string
		wantLine string
	}{
		"an unmodified driver": {
			driver:   func(t *testing.T) string { return serveDriver(t, stockIdentity{}, nil) },
			wantLine: "TIER none: the driver serves no Healer probe: the healer sidecar probes its volumes itself, on the node, and nothing heals them in place",
		},
		"a driver that probes only": {
			driver: func(t *testing.T) string {
				d, err := simulated.New(simulated.Options{StateDir: t.TempDir(), Capabilities: []healerv1alpha1.HealerCapability_RPC_Type{
					healerv1alpha1.HealerCapability_RPC_PROBE, healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES,
				}})
				if err != nil {
					t.Fatal(err)
				}
				return serveDriver(t, d.IdentityServer(), d.HealerServer())
			},
			wantLine: "TIER probe-only: the driver serves PROBE and no HEAL",
		},
		"a driver that probes and heals": {
			driver: func(t *testing.T) string {
				d, err := simulated.New(simulated.Options{StateDir: t.TempDir()})
				if err != nil {
					t.Fatal(err)
				}
				return serveDriver(t, d.IdentityServer(), d.HealerServer())
			},
			wantLine: "TIER healer: the driver serves the Healer service with HEAL",
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out bytes.Buffer
			cmd := newRootCommand("healerctl")
			cmd.SetOut(&out)
			cmd.SetArgs([]string{"sanity", "--endpoint", tt.driver(t), "--timeout", "5s"})
			if err := cmd.ExecuteContext(ctx); err != nil {
				t.Fatalf("healerctl sanity: %v, want success:\n%s", err, out.String())
			}
			if !strings.Contains(out.String(), "\n"+tt.wantLine) {
				t.Errorf("output has no line starting %q:\n%s", tt.wantLine, out.String())
			}
		})
	}
}

// The tiers sanity prints are the tiers a policy sees as driver.tier.
func TestSanityTiersArePolicyTiers(t *testing.T) {
	for got, want := range map[sanity.Tier]string{
		sanity.TierHealer: policy.TierHealer, sanity.TierProbeOnly: policy.TierProbeOnly, sanity.TierNone: policy.TierNone,
	} {
		if string(got) != want {
			t.Errorf("sanity tier %q, policy tier %q: they must be the same", got, want)
		}
	}
}
