package sidecar_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// TestProbeHealCycle probes a healthy volume, breaks it, heals it through the sidecar and
// probes it healthy again, checking what the driver received on the way.
func TestProbeHealCycle(t *testing.T) {
	f := newFixture(t)
	d := f.startDriver(simulated.Options{}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	sc := f.startSidecar(nil)
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))
	pv := f.pvName("pv-1")

	probe, err := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: pv})
	if err != nil {
		t.Fatalf("probe of a healthy volume: %v", err)
	}
	if len(probe.GetHealthStatuses()) != 0 || !probe.GetHealable() || probe.GetVolumeId() != "vol-1" {
		t.Fatalf("probe of a healthy volume = %v, want no health entries, healable, volume_id vol-1", probe)
	}

	// What kubelet would have given NodeStageVolume, computed here independently of the sidecar.
	sum := sha256.Sum256([]byte("vol-1"))
	wantPath := filepath.Join(f.kubeletDir, "plugins/kubernetes.io/csi", f.driverName, hex.EncodeToString(sum[:]), "globalmount")
	wantCap := &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4", MountFlags: []string{"discard"}}},
	}
	got := f.recorder.Probe()
	if got.GetVolumeId() != "vol-1" || got.GetStagingTargetPath() != wantPath {
		t.Errorf("driver got volume %q at %q, want vol-1 at %q", got.GetVolumeId(), got.GetStagingTargetPath(), wantPath)
	}
	if !proto.Equal(got.GetVolumeCapability(), wantCap) {
		t.Errorf("driver got capability %v, want %v", got.GetVolumeCapability(), wantCap)
	}
	if ctxAttrs := got.GetVolumeContext(); ctxAttrs["pool"] != "replicapool" || ctxAttrs["mounter"] != "rbd-nbd" {
		t.Errorf("driver got volume context %v, want the PV's volumeAttributes", ctxAttrs)
	}
	if len(got.GetSecrets()) != 0 {
		t.Errorf("driver got secrets for a PV without nodeStageSecretRef: %d keys", len(got.GetSecrets()))
	}

	if _, err := d.SetCondition("vol-1", control.Gone, 0); err != nil {
		t.Fatal(err)
	}
	probe, err = sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: pv})
	if err != nil {
		t.Fatalf("probe of a broken volume: %v", err)
	}
	if h := probe.GetHealthStatuses(); len(h) != 1 || h[0].GetStatus() != csi.VolumeHealthErrorType_INACCESSIBLE || h[0].GetReason() != "MountGone" {
		t.Fatalf("probe of a volume whose mount is gone = %v, want INACCESSIBLE/MountGone", h)
	}

	heal, err := sc.client.HealVolume(ctx, &healerv1alpha1.NodeHealVolumeRequest{PvName: pv})
	if err != nil {
		t.Fatalf("heal: %v", err)
	}
	if len(heal.GetHealthStatuses()) != 0 || heal.GetVolumeId() != "vol-1" {
		t.Fatalf("heal = %v, want no remaining health entries for vol-1", heal)
	}
	if hr := f.recorder.Heal(); hr.GetStagingTargetPath() != wantPath || !proto.Equal(hr.GetVolumeCapability(), wantCap) {
		t.Errorf("driver got heal request %v, want the same staging path and capability as the probe", hr)
	}

	probe, err = sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: pv})
	if err != nil || len(probe.GetHealthStatuses()) != 0 {
		t.Fatalf("probe after heal = %v, %v; want healthy", probe, err)
	}
}

// TestCapabilities checks that the sidecar reports the driver's identity and capabilities, and
// refuses RPCs the driver does not advertise without calling it.
func TestCapabilities(t *testing.T) {
	f := newFixture(t)
	d := f.startDriver(simulated.Options{
		Capabilities: []healerv1alpha1.HealerCapability_RPC_Type{healerv1alpha1.HealerCapability_RPC_PROBE},
		HealMounters: []string{"rbd-nbd"},
	}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	sc := f.startSidecar(nil)
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))

	caps, err := sc.client.GetHealerCapabilities(ctx, &healerv1alpha1.NodeGetHealerCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if caps.GetDriverName() != f.driverName || caps.GetNodeName() != f.nodeName || caps.GetVendorVersion() == "" {
		t.Errorf("identity = %q on %q (version %q), want %q on %q", caps.GetDriverName(), caps.GetNodeName(), caps.GetVendorVersion(), f.driverName, f.nodeName)
	}
	if !healerv1alpha1.HasRPC(caps.GetCapabilities(), healerv1alpha1.HealerCapability_RPC_PROBE) ||
		healerv1alpha1.HasRPC(caps.GetCapabilities(), healerv1alpha1.HealerCapability_RPC_HEAL) {
		t.Errorf("capabilities = %v, want PROBE and no HEAL", caps.GetCapabilities())
	}
	if caps.GetAttributes()["healMounters"] != "rbd-nbd" {
		t.Errorf("attributes = %v, want healMounters=rbd-nbd", caps.GetAttributes())
	}

	d.ResetCounters()
	_, err = sc.client.HealVolume(ctx, &healerv1alpha1.NodeHealVolumeRequest{PvName: f.pvName("pv-1")})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("heal against a driver without HEAL: %v, want UNIMPLEMENTED", err)
	}
	if caps.GetProbeSource() != healerv1alpha1.ProbeSource_PROBE_SOURCE_DRIVER {
		t.Errorf("probe source = %v, want the driver", caps.GetProbeSource())
	}
	// The sidecar lists the node's volumes from kubelet's records, which hold none here.
	list, err := sc.client.ListStagedVolumes(ctx, &healerv1alpha1.NodeListStagedVolumesRequest{})
	if err != nil || len(list.GetEntries()) != 0 {
		t.Errorf("list against a driver without LIST_VOLUMES: %v, %v; want an empty list from kubelet's records", list, err)
	}
	if c := d.Counters().Calls; c["HealVolume"] != 0 || c["ListStagedVolumes"] != 0 {
		t.Errorf("driver was called for RPCs it does not advertise: %v", c)
	}
}

// TestKeptVolumes relays the volume keeping a driver advertises and the kept of its probes; a
// driver that says kept without advertising keeping has it relayed as not kept.
func TestKeptVolumes(t *testing.T) {
	f := newFixture(t)
	d := f.startDriver(simulated.Options{
		VolumeKeeping: []healerv1alpha1.HealerCapability_VolumeKeeping_Type{healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART},
		KeepMounters:  []string{"rbd-nbd"},
	}, nil)
	if _, err := d.AddVolume(simulated.VolumeSpec{ID: "vol-krbd", Mounter: "krbd"}); err != nil {
		t.Fatal(err)
	}
	f.create(f.pv("pv-1", "vol-1"))
	f.create(f.pv("pv-2", "vol-krbd"))
	sc := f.startSidecar(nil)
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))

	caps, err := sc.client.GetHealerCapabilities(ctx, &healerv1alpha1.NodeGetHealerCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := healerv1alpha1.VolumeKeepingOf(caps.GetCapabilities()); !slices.Equal(got, []healerv1alpha1.HealerCapability_VolumeKeeping_Type{healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART}) {
		t.Errorf("relayed volume keeping = %v, want PLUGIN_RESTART", got)
	}
	for pv, want := range map[string]bool{"pv-1": true, "pv-2": false} {
		resp, err := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName(pv)})
		if err != nil || resp.GetKept() != want || len(resp.GetHealthStatuses()) != 0 {
			t.Errorf("probe of %s = %v, %v; want healthy, kept=%t", pv, resp, err, want)
		}
	}
	if _, err := d.SetCondition("vol-1", control.Gone, 0); err != nil {
		t.Fatal(err)
	}
	resp, err := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("pv-1")})
	if err != nil || !resp.GetKept() || len(resp.GetHealthStatuses()) != 1 || !resp.GetHealable() {
		t.Errorf("probe of a kept volume whose mount is gone = %v, %v; want its health, healable and kept", resp, err)
	}
}

func TestKeptWithoutKeepingIsNotRelayed(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, func(h healerv1alpha1.HealerServer) healerv1alpha1.HealerServer { return saysKept{h} })
	f.create(f.pv("pv-1", "vol-1"))
	sc := f.startSidecar(nil)
	f.waitReady(sc)
	resp, err := sc.client.ProbeVolume(f.as(f.token(controllerSA)), &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("pv-1")})
	if err != nil || resp.GetKept() {
		t.Fatalf("probe of a driver that says kept without advertising keeping = %v, %v; want kept=false", resp, err)
	}
}

// saysKept answers every probe with kept=true, whatever it advertises.
type saysKept struct{ healerv1alpha1.HealerServer }

func (s saysKept) ProbeVolume(ctx context.Context, req *healerv1alpha1.ProbeVolumeRequest) (*healerv1alpha1.ProbeVolumeResponse, error) {
	resp, err := s.HealerServer.ProbeVolume(ctx, req)
	if resp != nil {
		resp.Kept = true
	}
	return resp, err
}

// TestListStagedVolumes relays the driver's staged volumes page by page, with the PV names of the
// volumes the sidecar was called for, and none for the others (the controller maps such volumes
// from its own cache: the sidecar keeps no view of the cluster's PVs, and reads none ahead).
func TestListStagedVolumes(t *testing.T) {
	f := newFixture(t)
	d := f.startDriver(simulated.Options{SeedVolumes: []string{"vol-1", "vol-2", "vol-3", "vol-orphan"}}, nil)
	if _, err := d.AddVolume(simulated.VolumeSpec{ID: "vol-unstaged", NotStaged: true}); err != nil {
		t.Fatal(err)
	}
	pvs := []*corev1.PersistentVolume{f.pv("pv-1", "vol-1"), f.pv("pv-2", "vol-2"), f.pv("pv-3", "vol-3")}
	for _, pv := range pvs {
		f.create(pv)
	}
	f.create(f.pv("pv-unstaged", "vol-unstaged"))
	// Another driver's PV with the same handle must not be taken for ours.
	f.create(f.pv("other", "vol-orphan", func(pv *corev1.PersistentVolume) { pv.Spec.CSI.Driver = "other.example.com" }))
	sc := f.startSidecar(nil)
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))
	// The calls of a controller, with the facts of the PVs.
	for _, pv := range pvs {
		if _, err := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: pv.Name, Volume: probe.FactsOf(pv)}); err != nil {
			t.Fatalf("probe of %s: %v", pv.Name, err)
		}
	}

	list := func() (map[string]string, int) {
		got := map[string]string{}
		token := ""
		pages := 0
		for {
			resp, err := sc.client.ListStagedVolumes(ctx, &healerv1alpha1.NodeListStagedVolumesRequest{MaxEntries: 2, StartingToken: token})
			if err != nil {
				t.Fatalf("list page %d: %v", pages+1, err)
			}
			pages++
			if len(resp.GetEntries()) > 2 {
				t.Fatalf("page %d has %d entries, max_entries was 2", pages, len(resp.GetEntries()))
			}
			for _, e := range resp.GetEntries() {
				if _, dup := got[e.GetVolumeId()]; dup {
					t.Errorf("volume %s listed twice", e.GetVolumeId())
				}
				got[e.GetVolumeId()] = e.GetPvName()
				if !strings.HasPrefix(e.GetStagingTargetPath(), f.stagingRoot()) {
					t.Errorf("volume %s staged at %q, want under %s", e.GetVolumeId(), e.GetStagingTargetPath(), f.stagingRoot())
				}
			}
			if token = resp.GetNextToken(); token == "" {
				return got, pages
			}
		}
	}
	want := map[string]string{
		"vol-1":      f.pvName("pv-1"),
		"vol-2":      f.pvName("pv-2"),
		"vol-3":      f.pvName("pv-3"),
		"vol-orphan": "",
	}
	poll.Eventually(t, 10*time.Second, "the staged volumes with their PV names", func() (bool, string) {
		got, pages := list()
		if pages != 2 {
			t.Errorf("listing took %d pages of 2, want 2", pages)
		}
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprintf("staged volumes = %v, want %v", got, want)
	})
}

// TestAuthentication rejects calls without a valid token of an allowed identity for this node's
// sidecar, and lets the allowed one through: a token of the controller captured at another node,
// or one for every sidecar, opens nothing here.
func TestAuthentication(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	sc := f.startSidecar(nil)
	f.waitReady(sc)
	audienceSC := f.startSidecar(func(o *sidecar.Options) { o.TokenAudience = "healer-site" })
	f.waitReady(audienceSC)
	d := f.drv
	thisNode := healerv1alpha1.NodeTokenAudience(healerv1alpha1.DefaultTokenAudience, f.nodeName)

	tests := map[string]struct {
		sc   *running
		ctx  context.Context
		want codes.Code
	}{
		"no token": {
			sc: sc, ctx: f.ctx, want: codes.Unauthenticated,
		},
		"garbage token": {
			sc: sc, ctx: f.as("not-a-token"), want: codes.Unauthenticated,
		},
		"token of another ServiceAccount": {
			sc: sc, ctx: f.as(f.token(intruderSA)), want: codes.PermissionDenied,
		},
		"token of the controller for this node": {
			sc: sc, ctx: f.as(f.token(controllerSA, thisNode)), want: codes.OK,
		},
		"token of the controller captured at another node": {
			sc: sc, ctx: f.as(f.token(controllerSA, healerv1alpha1.NodeTokenAudience(healerv1alpha1.DefaultTokenAudience, "node-elsewhere"))), want: codes.Unauthenticated,
		},
		"token of the controller for every sidecar": {
			sc: sc, ctx: f.as(f.token(controllerSA, healerv1alpha1.DefaultTokenAudience)), want: codes.Unauthenticated,
		},
		"token for this node and another base audience": {
			sc: audienceSC, ctx: f.as(f.token(controllerSA, thisNode)), want: codes.Unauthenticated,
		},
		"token for this node and the configured base audience": {
			sc: audienceSC, ctx: f.as(f.token(controllerSA, healerv1alpha1.NodeTokenAudience("healer-site", f.nodeName))), want: codes.OK,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d.ResetCounters()
			_, err := tc.sc.client.ProbeVolume(tc.ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("pv-1")})
			if status.Code(err) != tc.want {
				t.Fatalf("probe: %v, want %s", err, tc.want)
			}
			_, err = tc.sc.client.GetHealerCapabilities(tc.ctx, &healerv1alpha1.NodeGetHealerCapabilitiesRequest{})
			if status.Code(err) != tc.want {
				t.Fatalf("capabilities: %v, want %s", err, tc.want)
			}
			calls := d.Counters().Calls["ProbeVolume"]
			if tc.want != codes.OK && calls != 0 {
				t.Errorf("a rejected call reached the driver (%d probes)", calls)
			}
		})
	}
	// The rejected calls are counted by reason: two calls each of the garbage token, the one
	// captured elsewhere and the one for every sidecar.
	body := scrape(t, sc.s)
	for _, want := range []string{
		`volume_healer_sidecar_auth_failures_total{reason="missing_token"} 2`,
		`volume_healer_sidecar_auth_failures_total{reason="invalid_token"} 6`,
		`volume_healer_sidecar_auth_failures_total{reason="forbidden_identity"} 2`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestTokenReviewsAreCached sends a burst of 200 calls with one token (and 50 with a bad one)
// and checks that they cost only a handful of TokenReviews.
func TestTokenReviewsAreCached(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	sc := f.startSidecar(nil)
	f.waitReady(sc)
	good := f.as(f.token(controllerSA))
	bad := f.as("garbage")
	f.tokenReviews.Store(0)

	var wg sync.WaitGroup
	errs := make(chan error, 250)
	for i := range 250 {
		wg.Go(func() {
			ctx, want := good, codes.OK
			if i%5 == 0 {
				ctx, want = bad, codes.Unauthenticated
			}
			_, err := sc.client.GetHealerCapabilities(ctx, &healerv1alpha1.NodeGetHealerCapabilitiesRequest{})
			if status.Code(err) != want {
				errs <- fmt.Errorf("call %d: %v, want %s", i, err, want)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := f.tokenReviews.Load(); n < 1 || n > 4 {
		t.Errorf("250 calls with two tokens made %d TokenReview requests, want 2 (at most 4)", n)
	}
}

// TestDriverDown answers UNAVAILABLE, naming the socket, while the driver is gone, and picks
// up the restarted driver with its new capabilities and a new restart marker.
func TestDriverDown(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	sc := f.startSidecar(nil)
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))
	<-sc.s.Registered()
	nodeKey := client.ObjectKey{Namespace: f.namespace, Name: sidecar.DefaultCSIAddonsNodeName(f.nodeName, f.driverName)}
	marker := func() string {
		var n csiaddonsv1alpha1.CSIAddonsNode
		if err := f.env.Client.Get(f.ctx, nodeKey, &n); err != nil {
			t.Fatal(err)
		}
		return n.Annotations[annotations.HealerRestart]
	}
	before := marker()

	f.stopDriver()
	_, err := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("pv-1")})
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), f.endpoint) {
		t.Fatalf("probe with the driver gone: %v, want UNAVAILABLE naming %s", err, f.endpoint)
	}
	if body := scrape(t, sc.s); !strings.Contains(body, `volume_healer_sidecar_driver_errors_total{code="Unavailable"}`) {
		t.Errorf("driver errors not counted:\n%s", grep(body, "driver_errors"))
	}

	// The driver comes back upgraded: it now heals nothing. The sidecar notices without a call.
	f.startDriver(simulated.Options{Capabilities: []healerv1alpha1.HealerCapability_RPC_Type{healerv1alpha1.HealerCapability_RPC_PROBE}}, nil)
	poll.Eventually(f.t, 20*time.Second, "capabilities refreshed after the driver restart", poll.True(func() bool {
		caps, err := sc.client.GetHealerCapabilities(ctx, &healerv1alpha1.NodeGetHealerCapabilitiesRequest{})
		return err == nil && !healerv1alpha1.HasRPC(caps.GetCapabilities(), healerv1alpha1.HealerCapability_RPC_HEAL)
	}))
	if _, err := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("pv-1")}); err != nil {
		t.Fatalf("probe after the driver came back: %v", err)
	}
	// Its mounters died with it: the controller must sweep the node again.
	poll.Eventually(f.t, 30*time.Second, "new restart marker after the driver restart", poll.True(func() bool { return marker() != before }))
}

// TestDriverHung answers DEADLINE_EXCEEDED once the sidecar's driver timeout, or the caller's
// shorter deadline, passes.
func TestDriverHung(t *testing.T) {
	f := newFixture(t)
	d := f.startDriver(simulated.Options{}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	sc := f.startSidecar(func(o *sidecar.Options) { o.DriverTimeout = 500 * time.Millisecond })
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))
	if _, err := d.SetCondition("vol-1", control.Hung, time.Hour); err != nil {
		t.Fatal(err)
	}

	// A call without a deadline is bounded by the sidecar's timeout, and the answer names the
	// driver that did not answer.
	start := time.Now()
	_, err := sc.client.ProbeVolume(context.WithoutCancel(ctx), &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("pv-1")})
	took := time.Since(start)
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(status.Convert(err).Message(), f.endpoint) {
		t.Fatalf("probe of a hung volume: %v, want DEADLINE_EXCEEDED naming the driver", err)
	}
	if took > 3*time.Second {
		t.Errorf("the sidecar's timeout of 500ms took %s to fire", took)
	}

	// A caller's deadline longer than the sidecar's timeout is kept (a long heal is not cut at
	// the timeout), less a margin in which the sidecar still answers, naming the driver.
	dctx, cancelD := context.WithTimeout(ctx, 2*time.Second)
	defer cancelD()
	start = time.Now()
	_, err = sc.client.ProbeVolume(dctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("pv-1")})
	took = time.Since(start)
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(status.Convert(err).Message(), f.endpoint) {
		t.Fatalf("probe of a hung volume with a 2s caller deadline: %v, want the sidecar's DEADLINE_EXCEEDED naming the driver", err)
	}
	if took < time.Second {
		t.Errorf("the call with a 2s deadline ended after %s: the sidecar's 500ms timeout cut it", took)
	}

	// A caller's deadline shorter than the sidecar's timeout wins.
	long := f.startSidecar(func(o *sidecar.Options) { o.DriverTimeout = time.Minute })
	f.waitReady(long)
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	_, err = long.client.ProbeVolume(cctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("pv-1")})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("probe with a 300ms caller deadline: %v, want DEADLINE_EXCEEDED", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the caller's 300ms deadline took %s", took)
	}
}

// TestDriverBusy passes the driver's ABORTED through while another call holds the volume.
func TestDriverBusy(t *testing.T) {
	f := newFixture(t)
	d := f.startDriver(simulated.Options{}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	sc := f.startSidecar(func(o *sidecar.Options) { o.DriverTimeout = time.Minute })
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))
	if _, err := d.SetCondition("vol-1", control.Hung, time.Hour); err != nil {
		t.Fatal(err)
	}

	first, cancelFirst := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := sc.client.ProbeVolume(first, &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("pv-1")})
		done <- err
	}()
	poll.Eventually(f.t, 10*time.Second, "first probe holds the volume", poll.True(func() bool { return d.Counters().InFlightPerVolume["vol-1"] == 1 }))

	_, err := sc.client.HealVolume(ctx, &healerv1alpha1.NodeHealVolumeRequest{PvName: f.pvName("pv-1")})
	if status.Code(err) != codes.Aborted || !strings.Contains(status.Convert(err).Message(), "in flight") {
		t.Fatalf("heal while a probe is in flight: %v, want the driver's ABORTED", err)
	}
	cancelFirst()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Errorf("canceled first probe: %v, want CANCELED", err)
	}
	if n := d.Counters().Aborted["vol-1"]; n != 1 {
		t.Errorf("driver aborted %d calls, want 1", n)
	}
}

// TestMalformedRequests checks the codes of requests the sidecar or the driver cannot serve.
func TestMalformedRequests(t *testing.T) {
	f := newFixture(t)
	d := f.startDriver(simulated.Options{}, nil)
	if _, err := d.AddVolume(simulated.VolumeSpec{ID: "vol-unstaged", NotStaged: true}); err != nil {
		t.Fatal(err)
	}
	f.create(f.pv("pv-1", "vol-1"))
	f.create(f.pv("other", "vol-2", func(pv *corev1.PersistentVolume) { pv.Spec.CSI.Driver = "other.example.com" }))
	f.create(f.pv("unstaged", "vol-unstaged"))
	f.create(f.pv("unknown-to-driver", "vol-nowhere"))
	f.create(f.pv("hostpath", "", func(pv *corev1.PersistentVolume) {
		pv.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp"}}
		pv.Spec.MountOptions = nil
	}))
	sc := f.startSidecar(nil)
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))

	tests := map[string]struct {
		pv      string
		want    codes.Code
		message string
	}{
		"empty pv name":                {pv: "", want: codes.InvalidArgument, message: "pv_name is required"},
		"unknown PV":                   {pv: f.pvName("missing"), want: codes.NotFound, message: "does not exist"},
		"PV of another driver":         {pv: f.pvName("other"), want: codes.InvalidArgument, message: `belongs to driver "other.example.com"`},
		"PV that is not a CSI volume":  {pv: f.pvName("hostpath"), want: codes.InvalidArgument, message: "no spec.csi"},
		"volume not staged here":       {pv: f.pvName("unstaged"), want: codes.FailedPrecondition, message: "not staged"},
		"volume unknown to the driver": {pv: f.pvName("unknown-to-driver"), want: codes.NotFound, message: "vol-nowhere"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, perr := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: tc.pv})
			_, herr := sc.client.HealVolume(ctx, &healerv1alpha1.NodeHealVolumeRequest{PvName: tc.pv})
			for rpc, err := range map[string]error{"probe": perr, "heal": herr} {
				if status.Code(err) != tc.want || !strings.Contains(status.Convert(err).Message(), tc.message) {
					t.Errorf("%s: %v, want %s mentioning %q", rpc, err, tc.want, tc.message)
				}
			}
		})
	}
	_, err := sc.client.ListStagedVolumes(ctx, &healerv1alpha1.NodeListStagedVolumesRequest{MaxEntries: -1})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("list with max_entries -1: %v, want INVALID_ARGUMENT", err)
	}
	_, err = sc.client.ListStagedVolumes(ctx, &healerv1alpha1.NodeListStagedVolumesRequest{StartingToken: "made-up"})
	if status.Code(err) != codes.Aborted {
		t.Errorf("list with a made-up token: %v, want the driver's ABORTED", err)
	}
}

// TestMalformedDriverResponse refuses to relay a health entry without a reason.
func TestMalformedDriverResponse(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, func(h healerv1alpha1.HealerServer) healerv1alpha1.HealerServer { return reasonless{h} })
	f.create(f.pv("pv-1", "vol-1"))
	sc := f.startSidecar(nil)
	f.waitReady(sc)
	_, err := sc.client.ProbeVolume(f.as(f.token(controllerSA)), &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("pv-1")})
	if status.Code(err) != codes.Internal || !strings.Contains(status.Convert(err).Message(), "empty reason") {
		t.Fatalf("probe answered with an empty reason: %v, want INTERNAL about the empty reason", err)
	}
}

// reasonless answers every probe with an INACCESSIBLE entry that has no reason.
type reasonless struct{ healerv1alpha1.HealerServer }

func (reasonless) ProbeVolume(context.Context, *healerv1alpha1.ProbeVolumeRequest) (*healerv1alpha1.ProbeVolumeResponse, error) {
	return &healerv1alpha1.ProbeVolumeResponse{HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_INACCESSIBLE}}}, nil
}

// TestStageSecrets hands the driver the node-stage Secret of the PV for a heal, follows changes to
// it within SecretCacheTTL, and answers UNAVAILABLE when it is missing; a probe carries no Secret
// and reads none.
func TestStageSecrets(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	secretNS := f.namespace
	f.create(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: secretNS, Name: "ceph-node-stage"},
		Data:       map[string][]byte{"userID": []byte("csi-rbd-node"), "userKey": []byte("AQBsecret==")},
	})
	withSecret := func(name string) func(*corev1.PersistentVolume) {
		return func(pv *corev1.PersistentVolume) {
			pv.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Namespace: secretNS, Name: name}
		}
	}
	f.create(f.pv("pv-1", "vol-1", withSecret("ceph-node-stage")))
	f.create(f.pv("pv-2", "vol-2", withSecret("does-not-exist")))
	counter := &apiCounter{}
	sc := f.startSidecar(func(o *sidecar.Options) {
		o.SecretCacheTTL = 500 * time.Millisecond
		counter.wrap(o)
	})
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))

	for _, pv := range []string{"pv-1", "pv-2"} {
		if _, err := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName(pv)}); err != nil {
			t.Fatalf("probe of %s: %v", pv, err)
		}
		if got := f.recorder.Probe().GetSecrets(); len(got) != 0 {
			t.Errorf("the driver's probe of %s got %d secrets, want none", pv, len(got))
		}
	}
	if got := counter.get("GET secrets"); got != 0 {
		t.Errorf("probes read %d Secrets, want 0", got)
	}
	if _, err := sc.client.HealVolume(ctx, &healerv1alpha1.NodeHealVolumeRequest{PvName: f.pvName("pv-1")}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"userID": "csi-rbd-node", "userKey": "AQBsecret=="}
	if got := f.recorder.Heal().GetSecrets(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("driver got secrets %v, want %v", got, want)
	}

	_, err := sc.client.HealVolume(ctx, &healerv1alpha1.NodeHealVolumeRequest{PvName: f.pvName("pv-2")})
	// UNAVAILABLE, which the controller retries: FAILED_PRECONDITION would say the volume is not
	// on this node, and the restart would be recorded with the volume never healed.
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "does-not-exist") {
		t.Errorf("heal of a PV whose secret is missing: %v, want UNAVAILABLE naming the secret", err)
	}

	// A rotated key reaches the driver once the cached one expires, without a restart.
	s, err := f.env.Clientset.CoreV1().Secrets(secretNS).Get(f.ctx, "ceph-node-stage", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Data["userKey"] = []byte("AQBrotated==")
	if _, err := f.env.Clientset.CoreV1().Secrets(secretNS).Update(f.ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(f.t, 10*time.Second, "rotated secret reaches the driver", poll.True(func() bool {
		_, err := sc.client.HealVolume(ctx, &healerv1alpha1.NodeHealVolumeRequest{PvName: f.pvName("pv-1")})
		return err == nil && f.recorder.Heal().GetSecrets()["userKey"] == "AQBrotated=="
	}))
}

// TestRestartMarker starts the sidecar twice next to a csi-addons sidecar's CSIAddonsNode:
// each start writes a new restart marker and the endpoint, and the csi-addons sidecar's spec and
// annotations stay as they were.
func TestRestartMarker(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	csiAddons := map[string]string{
		annotations.CSIAddonsPod:     "csi-addons-pod-uid",
		annotations.CSIAddonsRestart: "2026-01-02T03:04:05Z",
	}
	existing := &csiaddonsv1alpha1.CSIAddonsNode{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: f.nodeName + "-" + f.namespace + "-daemonset-csi-rbdplugin", Annotations: csiAddons},
		Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{
			Name: f.driverName, NodeID: f.nodeName, EndPoint: "pod://csi-rbdplugin-x.csi:9070",
		}},
	}
	if err := f.env.Client.Create(f.ctx, existing); err != nil {
		t.Fatal(err)
	}
	// A CSIAddonsNode of another driver on the same node must be left alone.
	unrelated := &csiaddonsv1alpha1.CSIAddonsNode{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: f.nodeName + "-cephfs"},
		Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{
			Name: "cephfs.csi.ceph.com", NodeID: f.nodeName, EndPoint: "pod://cephfs.csi:9070",
		}},
	}
	if err := f.env.Client.Create(f.ctx, unrelated); err != nil {
		t.Fatal(err)
	}

	markers := make([]string, 0, 2)
	for i := range 2 {
		sc := f.startSidecar(func(o *sidecar.Options) { o.AdvertiseAddress = "10.0.0.7" })
		select {
		case <-sc.s.Registered():
		case <-time.After(20 * time.Second):
			t.Fatalf("start %d: not registered within 20s", i+1)
		}
		var got csiaddonsv1alpha1.CSIAddonsNode
		if err := f.env.Client.Get(f.ctx, client.ObjectKeyFromObject(existing), &got); err != nil {
			t.Fatal(err)
		}
		marker := got.Annotations[annotations.HealerRestart]
		if marker == "" || !strings.HasSuffix(marker, "/uid-"+f.id) {
			t.Errorf("start %d: restart marker %q, want a time followed by /uid-%s", i+1, marker, f.id)
		}
		markers = append(markers, marker)
		_, port, _ := strings.Cut(sc.s.Addr().String(), ":")
		if ep := got.Annotations[annotations.Endpoint]; ep != "10.0.0.7:"+port {
			t.Errorf("start %d: endpoint annotation %q, want 10.0.0.7:%s", i+1, ep, port)
		}
		for k, v := range csiAddons {
			if got.Annotations[k] != v {
				t.Errorf("start %d: csi-addons annotation %s = %q, want %q unchanged", i+1, k, got.Annotations[k], v)
			}
		}
		if got.Spec != existing.Spec {
			t.Errorf("start %d: spec %+v changed, want %+v", i+1, got.Spec, existing.Spec)
		}
		if err := sc.stop(); err != nil {
			t.Fatal(err)
		}
	}
	if markers[0] == markers[1] {
		t.Errorf("two starts wrote the same restart marker %q", markers[0])
	}
	var other csiaddonsv1alpha1.CSIAddonsNode
	if err := f.env.Client.Get(f.ctx, client.ObjectKeyFromObject(unrelated), &other); err != nil {
		t.Fatal(err)
	}
	if _, touched := other.Annotations[annotations.HealerRestart]; touched {
		t.Errorf("the CSIAddonsNode of another driver got a restart marker")
	}
}

// TestCreatesCSIAddonsNode creates the CSIAddonsNode where no csi-addons sidecar did.
func TestCreatesCSIAddonsNode(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	sc := f.startSidecar(nil)
	select {
	case <-sc.s.Registered():
	case <-time.After(20 * time.Second):
		t.Fatal("not registered within 20s")
	}
	var got csiaddonsv1alpha1.CSIAddonsNode
	key := client.ObjectKey{Namespace: f.namespace, Name: sidecar.DefaultCSIAddonsNodeName(f.nodeName, f.driverName)}
	if err := f.env.Client.Get(f.ctx, key, &got); err != nil {
		t.Fatalf("CSIAddonsNode %s: %v", key, err)
	}
	want := csiaddonsv1alpha1.CSIAddonsNodeDriver{Name: f.driverName, NodeID: f.nodeName, EndPoint: sc.s.Addr().String()}
	if got.Spec.Driver != want {
		t.Errorf("spec.driver = %+v, want %+v", got.Spec.Driver, want)
	}
	if got.Annotations[annotations.Endpoint] != sc.s.Addr().String() || got.Annotations[annotations.HealerRestart] == "" {
		t.Errorf("annotations = %v, want the endpoint and a restart marker", got.Annotations)
	}
	if !strings.Contains(key.Name, "healer-example-com") {
		t.Errorf("default name %q keeps the driver's dots", key.Name)
	}
}

// TestGracefulShutdown lets a call in flight finish when the sidecar is told to stop, and
// refuses new connections afterwards.
func TestGracefulShutdown(t *testing.T) {
	f := newFixture(t)
	d := f.startDriver(simulated.Options{}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	sc := f.startSidecar(func(o *sidecar.Options) { o.ShutdownTimeout = 10 * time.Second })
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))
	if _, err := d.SetCondition("vol-1", control.Hung, time.Second); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("pv-1")})
		done <- err
	}()
	poll.Eventually(f.t, 10*time.Second, "probe in flight", poll.True(func() bool { return d.Counters().InFlight == 1 }))
	start := time.Now()
	if err := sc.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("the call in flight during the stop failed: %v", err)
	}
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("stop took %s with a call of about 1s in flight", took)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := sc.client.GetHealerCapabilities(cctx, &healerv1alpha1.NodeGetHealerCapabilitiesRequest{}); status.Code(err) != codes.Unavailable && status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("call after the stop: %v, want it refused", err)
	}
}

// TestShutdownCutsOffHungCalls bounds the stop by ShutdownTimeout when a call does not end.
func TestShutdownCutsOffHungCalls(t *testing.T) {
	f := newFixture(t)
	d := f.startDriver(simulated.Options{}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	sc := f.startSidecar(func(o *sidecar.Options) {
		o.ShutdownTimeout = 500 * time.Millisecond
		o.DriverTimeout = time.Minute
	})
	f.waitReady(sc)
	if _, err := d.SetCondition("vol-1", control.Hung, time.Hour); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := sc.client.ProbeVolume(f.as(f.token(controllerSA)), &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("pv-1")})
		done <- err
	}()
	poll.Eventually(f.t, 10*time.Second, "probe in flight", poll.True(func() bool { return d.Counters().InFlight == 1 }))
	start := time.Now()
	if err := sc.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("stop took %s, want about the 500ms shutdown timeout", took)
	}
	if err := <-done; err == nil {
		t.Error("the hung call succeeded; want it cut off")
	}
}

// TestMetricsEndpoint checks the names the sidecar exposes and that a call is counted under
// its RPC and code.
func TestMetricsEndpoint(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	sc := f.startSidecar(nil)
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))
	if _, err := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("pv-1")}); err != nil {
		t.Fatal(err)
	}
	_, _ = sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("missing")})
	_, _ = sc.client.ProbeVolume(f.ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("pv-1")})
	body := scrape(t, sc.s)
	for _, want := range []string{
		`volume_healer_sidecar_calls_total{code="OK",rpc="ProbeVolume"} 1`,
		`volume_healer_sidecar_calls_total{code="NotFound",rpc="ProbeVolume"} 1`,
		`volume_healer_sidecar_calls_total{code="Unauthenticated",rpc="ProbeVolume"} 1`,
		`volume_healer_sidecar_call_duration_seconds_count{rpc="ProbeVolume"} 3`,
		`volume_healer_sidecar_auth_failures_total{reason="missing_token"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, grep(body, "volume_healer_sidecar"))
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get("http://" + sc.s.MetricsAddr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s = %d, want 200 on a ready sidecar", path, resp.StatusCode)
		}
	}
}

func scrape(t *testing.T, s *sidecar.Sidecar) string {
	t.Helper()
	resp, err := http.Get("http://" + s.MetricsAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grep(body, substr string) string {
	var lines []string
	for l := range strings.Lines(body) {
		if strings.Contains(l, substr) && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "")
}

// TestIPv6 serves on an IPv6 address and advertises it in brackets.
func TestIPv6(t *testing.T) {
	if l, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("this machine has no IPv6 loopback: %v", err)
	} else {
		_ = l.Close()
	}
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	sc := f.startSidecar(func(o *sidecar.Options) { o.ListenAddress = "[::1]:0" })
	f.waitReady(sc)
	if _, err := sc.client.GetHealerCapabilities(f.as(f.token(controllerSA)), &healerv1alpha1.NodeGetHealerCapabilitiesRequest{}); err != nil {
		t.Fatalf("call over IPv6: %v", err)
	}
	_, port, _ := net.SplitHostPort(sc.s.Addr().String())
	if want := "[::1]:" + port; sc.s.Endpoint() != want {
		t.Errorf("advertised endpoint %q, want %q", sc.s.Endpoint(), want)
	}
}

// TestOnlyThisNodesVolumes sends probes and heals for PVs of the sidecar's driver that are not on
// its node: each is answered FAILED_PRECONDITION, naming the PV and the node, without reaching
// the driver. A volume without a VolumeAttachment (a driver without an attach step) is this
// node's when the driver lists it as staged here.
func TestOnlyThisNodesVolumes(t *testing.T) {
	f := newFixture(t)
	d := f.startDriver(simulated.Options{}, nil)
	elsewhere := func(node string) func(*corev1.PersistentVolume) {
		return func(pv *corev1.PersistentVolume) { pv.Annotations = map[string]string{attachedTo: node} }
	}
	f.create(f.pv("here", "vol-1"))
	f.create(f.pv("elsewhere", "vol-of-node-b", elsewhere("node-b")))
	f.create(f.pv("nowhere", "vol-of-nobody", elsewhere("")))
	f.create(f.pv("staged-unattached", "vol-2", elsewhere("")))
	sc := f.startSidecar(nil)
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))

	for name, tc := range map[string]struct {
		pv   string
		want codes.Code
	}{
		"attached to this node":                     {pv: f.pvName("here"), want: codes.OK},
		"attached to another node":                  {pv: f.pvName("elsewhere"), want: codes.FailedPrecondition},
		"attached nowhere, not staged here":         {pv: f.pvName("nowhere"), want: codes.FailedPrecondition},
		"attached nowhere, staged here (no attach)": {pv: f.pvName("staged-unattached"), want: codes.OK},
	} {
		t.Run(name, func(t *testing.T) {
			d.ResetCounters()
			_, perr := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: tc.pv})
			_, herr := sc.client.HealVolume(ctx, &healerv1alpha1.NodeHealVolumeRequest{PvName: tc.pv})
			for rpc, err := range map[string]error{"probe": perr, "heal": herr} {
				if status.Code(err) != tc.want {
					t.Errorf("%s: %v, want %s", rpc, err, tc.want)
				}
				if tc.want == codes.FailedPrecondition {
					for _, want := range []string{`PersistentVolume "` + tc.pv + `"`, `on node "` + f.nodeName + `"`, "acts only on its node's volumes"} {
						if msg := status.Convert(err).Message(); !strings.Contains(msg, want) {
							t.Errorf("%s: %q does not say %q", rpc, msg, want)
						}
					}
				}
			}
			if c := d.Counters().Calls; tc.want != codes.OK && (c["ProbeVolume"] != 0 || c["HealVolume"] != 0) {
				t.Errorf("a volume of another node reached the driver: %d probes, %d heals", c["ProbeVolume"], c["HealVolume"])
			}
		})
	}
}

// TestClientCertificates runs a sidecar with --client-ca-file: a caller without a client
// certificate, or with one another CA signed, fails the TLS handshake before any call; one the
// CA signed, with the controller's token, is answered.
func TestClientCertificates(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	sc := f.startSidecar(func(o *sidecar.Options) { o.ClientCAFile = f.caFile })
	f.waitReady(sc)
	signed, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	// Another fixture has a CA of its own.
	elsewhere := newFixture(t)
	other, err := tls.LoadX509KeyPair(elsewhere.certFile, elsewhere.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx := f.as(f.token(controllerSA))
	for name, tc := range map[string]struct {
		certs []tls.Certificate
		want  codes.Code
	}{
		"no client certificate":          {nil, codes.Unavailable},
		"a certificate of another CA":    {[]tls.Certificate{other}, codes.Unavailable},
		"a certificate of the client CA": {[]tls.Certificate{signed}, codes.OK},
	} {
		t.Run(name, func(t *testing.T) {
			creds := credentials.NewTLS(&tls.Config{RootCAs: f.caPool, MinVersion: tls.VersionTLS12, Certificates: tc.certs})
			conn, err := grpc.NewClient(sc.s.Addr().String(), grpc.WithTransportCredentials(creds))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_, err = healerv1alpha1.NewNodeHealerClient(conn).ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("pv-1")})
			if status.Code(err) != tc.want {
				t.Errorf("probe: %v, want %s", err, tc.want)
			}
		})
	}
}

// rawCodec sends a request's bytes as they are, so that a test can send what no well-behaved
// client would.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = data
	return nil
}
func (rawCodec) Name() string { return "proto" }

// TestAuthenticatedBeforeDecoding sends requests that are no protobuf message at all: without a
// token, or with a token the API server rejects, the caller learns only that it is not
// authenticated, since the sidecar reads no request before it knows who calls; with the
// controller's token the same bytes are read and refused as malformed.
func TestAuthenticatedBeforeDecoding(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	sc := f.startSidecar(nil)
	f.waitReady(sc)
	conn := sc.conn
	garbage := []byte{0xff, 0xff, 0xff, 0xff, 0x0f, 0x0a, 0x80}
	call := func(ctx context.Context) error {
		var reply []byte
		return conn.Invoke(ctx, "/"+healerv1alpha1.NodeHealer_ServiceDesc.ServiceName+"/ProbeVolume", garbage, &reply, grpc.ForceCodec(rawCodec{}))
	}
	tests := map[string]struct {
		ctx  context.Context
		want codes.Code
	}{
		"no token":                {ctx: f.ctx, want: codes.Unauthenticated},
		"a token the API rejects": {ctx: f.as("not-a-token"), want: codes.Unauthenticated},
		"the controller's token":  {ctx: f.as(f.token(controllerSA)), want: codes.Internal},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := call(tc.ctx)
			if status.Code(err) != tc.want {
				t.Fatalf("ProbeVolume with bytes that are no request: %v, want %s", err, tc.want)
			}
			if tc.want == codes.Unauthenticated && strings.Contains(err.Error(), "unmarshal") {
				t.Errorf("the refusal shows the request was decoded: %v", err)
			}
		})
	}
	body := scrape(t, sc.s)
	if want := `volume_healer_sidecar_calls_total{code="Unauthenticated",rpc="ProbeVolume"} 2`; !strings.Contains(body, want) {
		t.Errorf("metrics lack %q:\n%s", want, grep(body, "volume_healer_sidecar_calls_total"))
	}
}
