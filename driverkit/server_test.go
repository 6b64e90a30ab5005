package driverkit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csi-addons/spec/lib/go/identity"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/driverkit"
)

// fakeDriver is a Driver whose volumes are real mounts the test makes; what a driver knows
// beyond its mounts (staged or not, data lost, healable) is set by the test.
type fakeDriver struct {
	mu      sync.Mutex
	volumes map[string]*fakeVolume
}

type fakeVolume struct {
	rec         driverkit.Volume
	staged      bool
	lost        bool
	notHealable bool
	remount     func() error
	remounts    int
}

var _ driverkit.Driver = (*fakeDriver)(nil)

func newFakeDriver() *fakeDriver {
	return &fakeDriver{volumes: map[string]*fakeVolume{}}
}

func (d *fakeDriver) add(v *fakeVolume) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.volumes[v.rec.ID] = v
}

// update changes a volume under the driver's lock.
func (d *fakeDriver) update(id string, f func(v *fakeVolume)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(d.volumes[id])
}

func (d *fakeDriver) Volume(_ context.Context, id string) (driverkit.Volume, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.volumes[id]
	switch {
	case !ok:
		return driverkit.Volume{}, false, fmt.Errorf("%w: no volume %q", driverkit.ErrVolumeNotFound, id)
	case !v.staged:
		return driverkit.Volume{}, false, nil
	}
	return v.rec, true, nil
}

func (d *fakeDriver) StagedVolumes(context.Context) ([]driverkit.Volume, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var vs []driverkit.Volume
	for _, v := range d.volumes {
		if v.staged {
			vs = append(vs, v.rec)
		}
	}
	return vs, nil
}

func (d *fakeDriver) Inspect(_ context.Context, rec driverkit.Volume) ([]driverkit.Finding, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v := d.volumes[rec.ID]
	var findings []driverkit.Finding
	if v.lost {
		findings = append(findings, driverkit.Finding{Status: csi.VolumeHealthErrorType_DATA_LOSS, Reason: driverkit.ReasonDataLoss,
			Message: "the backing data of volume " + rec.ID + " is gone"})
	}
	return findings, !v.notHealable
}

func (d *fakeDriver) Remount(_ context.Context, rec driverkit.Volume) error {
	d.mu.Lock()
	v := d.volumes[rec.ID]
	v.remounts++
	remount := v.remount
	d.mu.Unlock()
	if remount == nil {
		return errors.New("this volume's mounter cannot be restarted")
	}
	return remount()
}

// logLines collects what a server logs.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
	}, funcr.Options{Verbosity: 2})
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// serve registers the kit's services for d on a gRPC server listening on a UNIX socket and
// returns a connection to it.
func serve(t *testing.T, d driverkit.Driver, opts driverkit.ServerOptions) (*grpc.ClientConn, string) {
	t.Helper()
	// A socket path must stay short; t.TempDir() holds the test's name.
	dir, err := os.MkdirTemp("", "driverkit")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "csi-addons.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	if err := driverkit.Register(srv, d, opts); err != nil {
		t.Fatalf("Register: %v", err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn, "unix://" + sock
}

// healthOf renders health entries as "STATUS/Reason" for comparisons.
func healthOf(entries []*csi.VolumeHealth_VolumeHealthEntry) []string {
	var hs []string
	for _, e := range entries {
		hs = append(hs, e.GetStatus().String()+"/"+e.GetReason())
	}
	return hs
}

func TestServer(t *testing.T) {
	requireMounts(t, true)
	root := sharedRoot(t)
	d := newFakeDriver()

	// A tmpfs volume with one publish target, a FUSE volume with one, a lost volume that this
	// driver cannot heal, and a volume the driver knows but has not staged here.
	tmpfsStaging := mkdir(t, root, "tmpfs", "globalmount")
	mountTmpfs(t, tmpfsStaging, 0)
	tmpfsTarget := mkdir(t, root, "pods", "a", "tmpfs")
	cleanupMounts(t, tmpfsTarget)
	if err := driverkit.BindMount(tmpfsStaging, tmpfsTarget, false); err != nil {
		t.Fatal(err)
	}
	d.add(&fakeVolume{staged: true, rec: driverkit.Volume{
		ID: "vol-tmpfs", StagingPath: tmpfsStaging, Expect: driverkit.Expect{Source: testSource, FSType: "tmpfs"},
		PublishTargets: []driverkit.PublishTarget{{Path: tmpfsTarget}}, VolumeContext: map[string]string{"mounter": "tmpfs"},
	}})

	fuseStaging := mkdir(t, root, "fuse", "globalmount")
	fuseTarget := mkdir(t, root, "pods", "b", "fuse")
	vol := newFUSEVolume(t, fuseStaging)
	cleanupMounts(t, fuseTarget)
	if err := driverkit.BindMount(fuseStaging, fuseTarget, true); err != nil {
		t.Fatal(err)
	}
	d.add(&fakeVolume{staged: true, remount: vol.remount, rec: driverkit.Volume{
		ID: "vol-fuse", StagingPath: fuseStaging, Expect: driverkit.Expect{Source: testSource, FSType: fuseFSType},
		PublishTargets: []driverkit.PublishTarget{{Path: fuseTarget, ReadOnly: true}},
	}})

	lostStaging := mkdir(t, root, "lost", "globalmount")
	mountTmpfs(t, lostStaging, 0)
	d.add(&fakeVolume{staged: true, lost: true, notHealable: true, rec: driverkit.Volume{ID: "vol-lost", StagingPath: lostStaging}})
	d.add(&fakeVolume{staged: false, rec: driverkit.Volume{ID: "vol-elsewhere", StagingPath: mkdir(t, root, "elsewhere")}})

	locks := &driverkit.Locks{}
	var logs logLines
	conn, _ := serve(t, d, driverkit.ServerOptions{
		DriverName: "kit.example.com", VendorVersion: "v0.1.0", NodeID: "node-1",
		Locks: locks, Checker: driverkit.NewChecker(driverkit.CheckerOptions{StatTimeout: 2 * time.Second}),
		Attributes: map[string]string{"healMounters": "fuse"},
		Logger:     logs.logger(),
	})
	ids := identity.NewIdentityClient(conn)
	hc := healerv1alpha1.NewHealerClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	probe := func(id, staging string, publish ...string) (*healerv1alpha1.ProbeVolumeResponse, error) {
		return hc.ProbeVolume(ctx, &healerv1alpha1.ProbeVolumeRequest{VolumeId: id, StagingTargetPath: staging, PublishTargetPaths: publish})
	}
	heal := func(id, staging string) (*healerv1alpha1.HealVolumeResponse, error) {
		return hc.HealVolume(ctx, &healerv1alpha1.HealVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	}

	t.Run("identity announces the Healer service", func(t *testing.T) {
		id, err := ids.GetIdentity(ctx, &identity.GetIdentityRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if id.GetName() != "kit.example.com" || id.GetVendorVersion() != "v0.1.0" ||
			id.GetManifest()[healerv1alpha1.IdentityManifestKey] != healerv1alpha1.Version || id.GetManifest()["nodeID"] != "node-1" {
			t.Errorf("GetIdentity = %v", id)
		}
		caps, err := ids.GetCapabilities(ctx, &identity.GetCapabilitiesRequest{})
		if err != nil || len(caps.GetCapabilities()) != 1 || caps.GetCapabilities()[0].GetService().GetType() != identity.Capability_Service_NODE_SERVICE {
			t.Errorf("GetCapabilities = %v, %v; want NODE_SERVICE", caps, err)
		}
		p, err := ids.Probe(ctx, &identity.ProbeRequest{})
		if err != nil || !p.GetReady().GetValue() {
			t.Errorf("Probe = %v, %v; want ready", p, err)
		}
	})

	t.Run("capabilities default to probe, heal and list", func(t *testing.T) {
		caps, err := hc.GetHealerCapabilities(ctx, &healerv1alpha1.GetHealerCapabilitiesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, rpc := range []healerv1alpha1.HealerCapability_RPC_Type{
			healerv1alpha1.HealerCapability_RPC_PROBE, healerv1alpha1.HealerCapability_RPC_HEAL, healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES,
		} {
			if !healerv1alpha1.HasRPC(caps.GetCapabilities(), rpc) {
				t.Errorf("capabilities %v lack %s", caps.GetCapabilities(), rpc)
			}
		}
		if caps.GetAttributes()["healMounters"] != "fuse" {
			t.Errorf("attributes = %v", caps.GetAttributes())
		}
	})

	t.Run("healthy volumes probe with empty health", func(t *testing.T) {
		for _, id := range []string{"vol-tmpfs", "vol-fuse"} {
			resp, err := probe(id, "")
			if err != nil || len(resp.GetHealthStatuses()) != 0 || !resp.GetHealable() {
				t.Errorf("ProbeVolume(%s) = %v, %v; want empty health, healable", id, resp, err)
			}
		}
	})

	t.Run("request errors", func(t *testing.T) {
		tests := map[string]struct {
			id, staging string
			want        codes.Code
			wantInMsg   []string
		}{
			"empty volume ID":        {want: codes.InvalidArgument},
			"unknown volume":         {id: "vol-nope", want: codes.NotFound, wantInMsg: []string{"vol-nope"}},
			"volume not staged here": {id: "vol-elsewhere", want: codes.FailedPrecondition, wantInMsg: []string{"vol-elsewhere"}},
			"wrong staging path": {
				id: "vol-tmpfs", staging: "/var/lib/kubelet/plugins/other/globalmount", want: codes.FailedPrecondition,
				wantInMsg: []string{tmpfsStaging, "/var/lib/kubelet/plugins/other/globalmount"},
			},
		}
		for name, tc := range tests {
			t.Run(name, func(t *testing.T) {
				_, perr := probe(tc.id, tc.staging)
				_, herr := heal(tc.id, tc.staging)
				for rpc, err := range map[string]error{"ProbeVolume": perr, "HealVolume": herr} {
					if status.Code(err) != tc.want {
						t.Errorf("%s: %v, want %s", rpc, err, tc.want)
					}
					for _, s := range tc.wantInMsg {
						if !strings.Contains(status.Convert(err).Message(), s) {
							t.Errorf("%s message %q does not name %s", rpc, status.Convert(err).Message(), s)
						}
					}
				}
			})
		}
		if _, err := probe("vol-tmpfs", tmpfsStaging+"/"); err != nil {
			t.Errorf("ProbeVolume with the staging path spelled with a trailing slash: %v", err)
		}
	})

	t.Run("a busy volume is ABORTED", func(t *testing.T) {
		unlock, ok := locks.TryLock("vol-fuse")
		if !ok {
			t.Fatal("vol-fuse is locked")
		}
		defer unlock()
		for rpc, call := range map[string]func() error{
			"ProbeVolume": func() error { _, err := probe("vol-fuse", ""); return err },
			"HealVolume":  func() error { _, err := heal("vol-fuse", ""); return err },
		} {
			if err := call(); status.Code(err) != codes.Aborted {
				t.Errorf("%s while the volume's lock is held: %v, want ABORTED", rpc, err)
			}
		}
	})

	t.Run("a dead FUSE mounter is found and healed", func(t *testing.T) {
		vol.killDaemon()
		resp, err := probe("vol-fuse", fuseStaging)
		if err != nil {
			t.Fatal(err)
		}
		if got := healthOf(resp.GetHealthStatuses()); !slices.Equal(got, []string{"INACCESSIBLE/MountDisconnected"}) || !resp.GetHealable() {
			t.Fatalf("ProbeVolume of a dead FUSE mount = %v (healable %t), want INACCESSIBLE/MountDisconnected, healable", resp.GetHealthStatuses(), resp.GetHealable())
		}
		msg := resp.GetHealthStatuses()[0].GetMessage()
		if !strings.Contains(msg, fuseStaging) || !strings.Contains(msg, fuseTarget) {
			t.Errorf("message %q should name the staging path and the publish target", msg)
		}

		hresp, err := heal("vol-fuse", fuseStaging)
		if err != nil {
			t.Fatalf("HealVolume: %v", err)
		}
		if len(hresp.GetHealthStatuses()) != 0 {
			t.Fatalf("HealVolume left %v", hresp.GetHealthStatuses())
		}
		if b, err := os.ReadFile(filepath.Join(fuseTarget, dataFile)); err != nil || string(b) != "data" {
			t.Fatalf("read through the publish target after the heal: %q, %v", b, err)
		}
		if resp, err := probe("vol-fuse", ""); err != nil || len(resp.GetHealthStatuses()) != 0 {
			t.Fatalf("ProbeVolume after the heal = %v, %v; want healthy", resp, err)
		}
		if !strings.Contains(logs.String(), `"volume"="vol-fuse"`) || !strings.Contains(logs.String(), "started the mounter") {
			t.Errorf("the heal's actions were not logged; log:\n%s", logs.String())
		}
	})

	t.Run("healing a healthy volume changes nothing", func(t *testing.T) {
		before := mountCount(t, tmpfsTarget)
		resp, err := heal("vol-tmpfs", "")
		if err != nil || len(resp.GetHealthStatuses()) != 0 {
			t.Fatalf("HealVolume of a healthy volume = %v, %v", resp, err)
		}
		if after := mountCount(t, tmpfsTarget); after != before {
			t.Errorf("the heal changed the publish target's mounts from %d to %d", before, after)
		}
	})

	t.Run("publish targets of the request are checked too", func(t *testing.T) {
		extra := mkdir(t, root, "pods", "c", "tmpfs")
		resp, err := probe("vol-tmpfs", "", extra, tmpfsTarget)
		if err != nil {
			t.Fatal(err)
		}
		if got := healthOf(resp.GetHealthStatuses()); !slices.Equal(got, []string{"INACCESSIBLE/MountGone"}) ||
			!strings.Contains(resp.GetHealthStatuses()[0].GetMessage(), extra) {
			t.Fatalf("ProbeVolume with an unmounted publish target = %v, want INACCESSIBLE/MountGone naming %s", resp.GetHealthStatuses(), extra)
		}
	})

	t.Run("lost data that cannot be healed", func(t *testing.T) {
		resp, err := probe("vol-lost", "")
		if err != nil {
			t.Fatal(err)
		}
		if got := healthOf(resp.GetHealthStatuses()); !slices.Equal(got, []string{"DATA_LOSS/DataLoss"}) || resp.GetHealable() {
			t.Fatalf("ProbeVolume of a lost volume = %v (healable %t), want DATA_LOSS/DataLoss, not healable", resp.GetHealthStatuses(), resp.GetHealable())
		}
		_, err = heal("vol-lost", "")
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "backing data") {
			t.Fatalf("HealVolume of a volume Inspect says is not healable: %v, want FAILED_PRECONDITION with the driver's finding", err)
		}
	})

	t.Run("listing pages in volume ID order", func(t *testing.T) {
		want := []string{"vol-fuse", "vol-lost", "vol-tmpfs"}
		for _, size := range []int32{0, 1, 2, 3, 10} {
			var got []string
			token := ""
			for page := 0; ; page++ {
				resp, err := hc.ListStagedVolumes(ctx, &healerv1alpha1.ListStagedVolumesRequest{MaxEntries: size, StartingToken: token})
				if err != nil {
					t.Fatalf("ListStagedVolumes(max %d) page %d: %v", size, page, err)
				}
				if size > 0 && len(resp.GetEntries()) > int(size) {
					t.Fatalf("page of %d entries with max_entries %d", len(resp.GetEntries()), size)
				}
				for _, e := range resp.GetEntries() {
					got = append(got, e.GetVolumeId())
					if e.GetVolumeId() == "vol-tmpfs" && (e.GetStagingTargetPath() != tmpfsStaging ||
						!slices.Equal(e.GetPublishTargetPaths(), []string{tmpfsTarget}) || e.GetVolumeContext()["mounter"] != "tmpfs") {
						t.Errorf("entry %v does not carry the driver's record", e)
					}
				}
				if token = resp.GetNextToken(); token == "" {
					break
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("listing %d at a time = %v, want %v", size, got, want)
			}
		}
		if _, err := hc.ListStagedVolumes(ctx, &healerv1alpha1.ListStagedVolumesRequest{MaxEntries: -1}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("ListStagedVolumes with max_entries -1: %v, want INVALID_ARGUMENT", err)
		}
		if _, err := hc.ListStagedVolumes(ctx, &healerv1alpha1.ListStagedVolumesRequest{StartingToken: "not-a-token"}); status.Code(err) != codes.Aborted {
			t.Errorf("ListStagedVolumes with a foreign token: %v, want ABORTED", err)
		}
	})
}

func TestServerServesOnlyAdvertisedRPCs(t *testing.T) {
	d := newFakeDriver()
	d.add(&fakeVolume{staged: true, rec: driverkit.Volume{ID: "v", StagingPath: "/nonexistent/globalmount"}})
	conn, _ := serve(t, d, driverkit.ServerOptions{
		DriverName:   "kit.example.com",
		Capabilities: []healerv1alpha1.HealerCapability_RPC_Type{healerv1alpha1.HealerCapability_RPC_PROBE},
	})
	hc := healerv1alpha1.NewHealerClient(conn)
	ctx := context.Background()

	caps, err := hc.GetHealerCapabilities(ctx, &healerv1alpha1.GetHealerCapabilitiesRequest{})
	if err != nil || len(caps.GetCapabilities()) != 1 {
		t.Fatalf("GetHealerCapabilities = %v, %v; want PROBE only", caps, err)
	}
	if _, err := hc.HealVolume(ctx, &healerv1alpha1.HealVolumeRequest{VolumeId: "v"}); status.Code(err) != codes.Unimplemented {
		t.Errorf("HealVolume not advertised: %v, want UNIMPLEMENTED", err)
	}
	if _, err := hc.ListStagedVolumes(ctx, &healerv1alpha1.ListStagedVolumesRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("ListStagedVolumes not advertised: %v, want UNIMPLEMENTED", err)
	}
	resp, err := hc.ProbeVolume(ctx, &healerv1alpha1.ProbeVolumeRequest{VolumeId: "v"})
	if err != nil || !slices.Equal(healthOf(resp.GetHealthStatuses()), []string{"INACCESSIBLE/MountGone"}) {
		t.Errorf("ProbeVolume of a volume whose staging path is missing = %v, %v; want INACCESSIBLE/MountGone", resp, err)
	}
}

// TestServerReportsKeptVolumes serves a driver that keeps some volumes alive across node plugin
// restarts: it advertises the keeping, a probe says which volumes are kept, and a kept volume
// whose mount is gone is reported broken and healable like any other. A driver that advertises
// no keeping reports no volume kept, whatever its records say.
func TestServerReportsKeptVolumes(t *testing.T) {
	d := newFakeDriver()
	d.add(&fakeVolume{staged: true, rec: driverkit.Volume{ID: "kept", StagingPath: "/nonexistent/kept/globalmount", Kept: true}})
	d.add(&fakeVolume{staged: true, rec: driverkit.Volume{ID: "plain", StagingPath: "/nonexistent/plain/globalmount"}})
	ctx := context.Background()

	keeping, _ := serve(t, d, driverkit.ServerOptions{
		DriverName:    "kit.example.com",
		VolumeKeeping: []healerv1alpha1.HealerCapability_VolumeKeeping_Type{healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART},
	})
	hc := healerv1alpha1.NewHealerClient(keeping)
	caps, err := hc.GetHealerCapabilities(ctx, &healerv1alpha1.GetHealerCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := healerv1alpha1.VolumeKeepingOf(caps.GetCapabilities()); !slices.Equal(got, []healerv1alpha1.HealerCapability_VolumeKeeping_Type{healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART}) {
		t.Errorf("advertised keeping = %v, want PLUGIN_RESTART", got)
	}
	if !healerv1alpha1.HasRPC(caps.GetCapabilities(), healerv1alpha1.HealerCapability_RPC_HEAL) {
		t.Errorf("capabilities %v lost the default RPCs", caps.GetCapabilities())
	}
	for id, want := range map[string]bool{"kept": true, "plain": false} {
		resp, err := hc.ProbeVolume(ctx, &healerv1alpha1.ProbeVolumeRequest{VolumeId: id})
		if err != nil {
			t.Fatalf("ProbeVolume(%s): %v", id, err)
		}
		if resp.GetKept() != want {
			t.Errorf("ProbeVolume(%s).kept = %t, want %t", id, resp.GetKept(), want)
		}
		if !resp.GetHealable() || !slices.Equal(healthOf(resp.GetHealthStatuses()), []string{"INACCESSIBLE/MountGone"}) {
			t.Errorf("ProbeVolume(%s) of a gone mount = %v; want INACCESSIBLE/MountGone and healable, kept or not", id, resp)
		}
	}

	plain, _ := serve(t, d, driverkit.ServerOptions{DriverName: "kit.example.com"})
	hc = healerv1alpha1.NewHealerClient(plain)
	caps, err = hc.GetHealerCapabilities(ctx, &healerv1alpha1.GetHealerCapabilitiesRequest{})
	if err != nil || len(healerv1alpha1.VolumeKeepingOf(caps.GetCapabilities())) != 0 {
		t.Errorf("GetHealerCapabilities without VolumeKeeping = %v, %v; want no keeping advertised", caps, err)
	}
	if resp, err := hc.ProbeVolume(ctx, &healerv1alpha1.ProbeVolumeRequest{VolumeId: "kept"}); err != nil || resp.GetKept() {
		t.Errorf("ProbeVolume of a Kept record from a driver that advertises no keeping = %v, %v; want kept=false", resp, err)
	}
}

func TestRegisterRejectsInvalidOptions(t *testing.T) {
	d := newFakeDriver()
	tests := map[string]struct {
		d    driverkit.Driver
		opts driverkit.ServerOptions
	}{
		"no driver name": {d: d},
		"no driver":      {opts: driverkit.ServerOptions{DriverName: "x"}},
		"no PROBE": {d: d, opts: driverkit.ServerOptions{DriverName: "x",
			Capabilities: []healerv1alpha1.HealerCapability_RPC_Type{healerv1alpha1.HealerCapability_RPC_HEAL}}},
		"UNKNOWN capability": {d: d, opts: driverkit.ServerOptions{DriverName: "x",
			Capabilities: []healerv1alpha1.HealerCapability_RPC_Type{healerv1alpha1.HealerCapability_RPC_PROBE, healerv1alpha1.HealerCapability_RPC_UNKNOWN}}},
		"capability twice": {d: d, opts: driverkit.ServerOptions{DriverName: "x",
			Capabilities: []healerv1alpha1.HealerCapability_RPC_Type{healerv1alpha1.HealerCapability_RPC_PROBE, healerv1alpha1.HealerCapability_RPC_PROBE}}},
		"UNKNOWN keeping": {d: d, opts: driverkit.ServerOptions{DriverName: "x",
			VolumeKeeping: []healerv1alpha1.HealerCapability_VolumeKeeping_Type{healerv1alpha1.HealerCapability_VolumeKeeping_UNKNOWN}}},
		"undefined keeping": {d: d, opts: driverkit.ServerOptions{DriverName: "x",
			VolumeKeeping: []healerv1alpha1.HealerCapability_VolumeKeeping_Type{7}}},
		"keeping twice": {d: d, opts: driverkit.ServerOptions{DriverName: "x",
			VolumeKeeping: []healerv1alpha1.HealerCapability_VolumeKeeping_Type{healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART, healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			srv := grpc.NewServer()
			defer srv.Stop()
			if err := driverkit.Register(srv, tc.d, tc.opts); !errors.Is(err, driverkit.ErrInvalidOptions) {
				t.Fatalf("Register: %v, want ErrInvalidOptions", err)
			}
			if len(srv.GetServiceInfo()) != 0 {
				t.Errorf("Register failed but registered %v", srv.GetServiceInfo())
			}
		})
	}
}
