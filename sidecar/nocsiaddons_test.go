package sidecar_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// csiIdentity is the CSI Identity service of a driver that knows nothing of CSI-Addons, as
// every CSI node plugin serves it to kubelet on its CSI socket.
type csiIdentity struct {
	csi.UnimplementedIdentityServer
	name string
}

func (c *csiIdentity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: c.name, VendorVersion: "v9.9.9"}, nil
}

// serveCSI serves a CSI Identity service naming the driver name on the socket path until the
// returned function stops it (the socket file goes with it).
func serveCSI(t *testing.T, path, name string) (stop func()) {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, &csiIdentity{name: name})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return srv.Stop
}

// stageRecord writes kubelet's staging record of volume handle of the fixture's driver for PV
// pv, its staging folder mounted nothing, and returns the staging path.
func (f *fixture) stageRecord(handle, pv string) string {
	f.t.Helper()
	staging := healerv1alpha1.StagingTargetPath(f.stagingRoot(), f.driverName, handle)
	writeVolData(f.t, filepath.Dir(staging), map[string]string{"driverName": f.driverName, "volumeHandle": handle, "specVolID": pv})
	if err := os.MkdirAll(staging, 0o750); err != nil {
		f.t.Fatal(err)
	}
	return staging
}

// TestDriverWithoutCSIAddonsSocket: a driver that has no CSI-Addons socket at all is served on
// its CSI socket (its name from GetPluginInfo) or by its name alone: the sidecar registers its
// CSIAddonsNode under that name, answers capabilities of tier none (the sidecar probes and lists,
// nobody heals), probes and lists its volumes from kubelet's records, and, on the CSI socket,
// writes a new restart marker when the driver comes back after a restart. A CSI socket that
// names another driver than --driver-name keeps the sidecar unready.
func TestDriverWithoutCSIAddonsSocket(t *testing.T) {
	f := newFixture(t)
	csiSock := filepath.Join(filepath.Dir(strings.TrimPrefix(f.endpoint, "unix://")), "csi.sock")
	stopCSI := serveCSI(t, csiSock, f.driverName)
	pv := f.pv("pv-1", "vol-1", func(pv *corev1.PersistentVolume) { pv.Annotations = map[string]string{attachedTo: ""} })
	f.create(pv)
	staging := f.stageRecord("vol-1", pv.Name)

	sc := f.startSidecar(func(o *sidecar.Options) { o.DriverEndpoint, o.CSIEndpoint = "", "unix://"+csiSock })
	select {
	case <-sc.s.Registered():
	case <-time.After(20 * time.Second):
		t.Fatal("not registered within 20s")
	}
	key := client.ObjectKey{Namespace: f.namespace, Name: sidecar.DefaultCSIAddonsNodeName(f.nodeName, f.driverName)}
	marker := func() string {
		var got csiaddonsv1alpha1.CSIAddonsNode
		if err := f.env.Client.Get(f.ctx, key, &got); err != nil {
			t.Fatalf("CSIAddonsNode %s: %v", key, err)
		}
		if got.Spec.Driver.Name != f.driverName || got.Spec.Driver.NodeID != f.nodeName {
			t.Fatalf("CSIAddonsNode %s is of driver %q on %q, want %q on %q", key, got.Spec.Driver.Name, got.Spec.Driver.NodeID, f.driverName, f.nodeName)
		}
		return got.Annotations[annotations.HealerRestart]
	}
	first := marker()
	if first == "" {
		t.Fatal("no restart marker on the CSIAddonsNode")
	}

	ctx := f.as(f.token(controllerSA))
	caps, err := sc.client.GetHealerCapabilities(ctx, &healerv1alpha1.NodeGetHealerCapabilitiesRequest{})
	if err != nil {
		t.Fatalf("capabilities: %v", err)
	}
	if caps.GetDriverName() != f.driverName || caps.GetVendorVersion() != "v9.9.9" || caps.GetProbeSource() != healerv1alpha1.ProbeSource_PROBE_SOURCE_SIDECAR ||
		healerv1alpha1.HasRPC(caps.GetCapabilities(), healerv1alpha1.HealerCapability_RPC_HEAL) ||
		!healerv1alpha1.HasRPC(caps.GetCapabilities(), healerv1alpha1.HealerCapability_RPC_PROBE) {
		t.Fatalf("capabilities %v: want driver %s v9.9.9, PROBE by the sidecar, no HEAL", caps, f.driverName)
	}
	probe, err := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: pv.Name})
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	if h := probe.GetHealthStatuses(); probe.GetProbeSource() != healerv1alpha1.ProbeSource_PROBE_SOURCE_SIDECAR || len(h) != 1 ||
		h[0].GetStatus() != csi.VolumeHealthErrorType_INACCESSIBLE || !strings.Contains(h[0].GetMessage(), staging) {
		t.Fatalf("probe of a volume staged at a folder with nothing mounted: %v; want INACCESSIBLE naming %s, probed by the sidecar", probe, staging)
	}
	if _, err := sc.client.HealVolume(ctx, &healerv1alpha1.NodeHealVolumeRequest{PvName: pv.Name}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("heal: %v, want UNIMPLEMENTED: the driver serves no Healer service", err)
	}
	list, err := sc.client.ListStagedVolumes(ctx, &healerv1alpha1.NodeListStagedVolumesRequest{})
	if err != nil || len(list.GetEntries()) != 1 || list.GetEntries()[0].GetPvName() != pv.Name {
		t.Fatalf("list: %v, %v; want %s from kubelet's records", list, err, pv.Name)
	}

	// The driver restarts: its CSI socket goes away and comes back.
	stopCSI()
	serveCSI(t, csiSock, f.driverName)
	poll.Eventually(t, 20*time.Second, "a new restart marker after the driver's restart", func() (bool, string) {
		m := marker()
		return m != first, "marker still " + m
	})
	if err := sc.stop(); err != nil {
		t.Fatal(err)
	}

	t.Run("by name alone", func(t *testing.T) {
		byName := f.startSidecar(func(o *sidecar.Options) { o.DriverEndpoint, o.DriverName = "", f.driverName })
		select {
		case <-byName.s.Registered():
		case <-time.After(20 * time.Second):
			t.Fatal("not registered within 20s")
		}
		caps, err := byName.client.GetHealerCapabilities(ctx, &healerv1alpha1.NodeGetHealerCapabilitiesRequest{})
		if err != nil || caps.GetDriverName() != f.driverName || caps.GetProbeSource() != healerv1alpha1.ProbeSource_PROBE_SOURCE_SIDECAR {
			t.Fatalf("capabilities %v, %v: want driver %s probed by the sidecar", caps, err, f.driverName)
		}
		if _, err := byName.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: pv.Name}); err != nil {
			t.Fatalf("probe: %v", err)
		}
		if err := byName.stop(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a CSI socket of another driver", func(t *testing.T) {
		wrong := f.startSidecar(func(o *sidecar.Options) {
			o.DriverEndpoint, o.CSIEndpoint, o.DriverName = "", "unix://"+csiSock, "other.example.com"
		})
		// The sidecar asks the driver's name at least every second: after three, it must still
		// refuse to serve another driver's volumes.
		err := poll.Until(f.ctx, 3*time.Second, "the sidecar to serve a driver of another name", func() (bool, string) {
			return wrong.s.Ready(), "not ready"
		})
		if err == nil {
			t.Fatal("the sidecar became ready for driver other.example.com on the CSI socket of " + f.driverName)
		}
		_, err = wrong.client.GetHealerCapabilities(ctx, &healerv1alpha1.NodeGetHealerCapabilitiesRequest{})
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "--driver-name") {
			t.Fatalf("capabilities: %v; want UNAVAILABLE saying the names differ", err)
		}
	})
}
