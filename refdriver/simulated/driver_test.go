package simulated_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csi-addons/spec/lib/go/identity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	testingclock "k8s.io/utils/clock/testing"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
)

// node is one reference driver served on real UNIX sockets, with clients for both.
type node struct {
	d        *simulated.Driver
	healer   healerv1alpha1.HealerClient
	identity identity.IdentityClient
	control  *simulated.ControlClient
	stateDir string
	endpoint string
	stop     func()
}

// socketDir returns a short folder for sockets: a UNIX socket path must stay under 108 bytes,
// which the test's own temp folder (named after the test) can exceed.
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func startNode(t *testing.T, opts simulated.Options) *node {
	t.Helper()
	if opts.StateDir == "" {
		opts.StateDir = t.TempDir()
	}
	d, err := simulated.New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	sock := socketDir(t)
	endpoint := "unix://" + filepath.Join(sock, "csi-addons.sock")
	controlEndpoint := "unix://" + filepath.Join(sock, "control.sock")
	srv, err := simulated.NewServer(d, simulated.ServerOptions{Endpoint: endpoint, ControlEndpoint: controlEndpoint, ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()

	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	control, err := simulated.NewControlClient(controlEndpoint)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start returned %v after shutdown", err)
		}
	}
	t.Cleanup(stop)
	return &node{
		d:        d,
		healer:   healerv1alpha1.NewHealerClient(conn),
		identity: identity.NewIdentityClient(conn),
		control:  control,
		stateDir: opts.StateDir,
		endpoint: endpoint,
		stop:     stop,
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

type healthEntry struct {
	status csi.VolumeHealthErrorType
	reason string
}

func entries(h []*csi.VolumeHealth_VolumeHealthEntry) []healthEntry {
	var out []healthEntry
	for _, e := range h {
		if e.GetMessage() == "" {
			out = append(out, healthEntry{reason: "entry without message"})
			continue
		}
		out = append(out, healthEntry{e.GetStatus(), e.GetReason()})
	}
	return out
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func TestProbeVolume(t *testing.T) {
	stagingVol1 := healerv1alpha1.StagingTargetPath(healerv1alpha1.DefaultKubeletCSIPluginDir, "healer.example.com", "vol-1")
	tests := map[string]struct {
		setup        func(t *testing.T, d *simulated.Driver)
		req          *healerv1alpha1.ProbeVolumeRequest
		wantCode     codes.Code
		wantHealth   []healthEntry
		wantHealable bool
		wantRecheck  time.Duration
	}{
		"healthy volume reports empty health": {
			req:          &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-1"},
			wantHealable: true,
		},
		"the kubelet staging path is accepted": {
			req:          &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-1", StagingTargetPath: stagingVol1},
			wantHealable: true,
		},
		"gone mount is INACCESSIBLE": {
			setup: func(t *testing.T, d *simulated.Driver) {
				must[simulated.Volume](t)(d.SetCondition("vol-1", control.Gone, 0))
			},
			req:          &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-1"},
			wantHealth:   []healthEntry{{csi.VolumeHealthErrorType_INACCESSIBLE, "MountGone"}},
			wantHealable: true,
		},
		"read-only mount is DEGRADED": {
			setup: func(t *testing.T, d *simulated.Driver) {
				must[simulated.Volume](t)(d.SetCondition("vol-1", control.ReadOnly, 0))
			},
			req:          &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-1"},
			wantHealth:   []healthEntry{{csi.VolumeHealthErrorType_DEGRADED, "ReadOnlyMount"}},
			wantHealable: true,
		},
		"lost volume is DATA_LOSS": {
			setup: func(t *testing.T, d *simulated.Driver) {
				must[simulated.Volume](t)(d.SetCondition("vol-1", control.Lost, 0))
			},
			req:          &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-1"},
			wantHealth:   []healthEntry{{csi.VolumeHealthErrorType_DATA_LOSS, "DataLoss"}},
			wantHealable: true,
		},
		"kernel-mounted volume is not healable": {
			setup: func(t *testing.T, d *simulated.Driver) {
				must[simulated.Volume](t)(d.AddVolume(simulated.VolumeSpec{ID: "krbd-1", Mounter: "krbd"}))
			},
			req:          &healerv1alpha1.ProbeVolumeRequest{VolumeId: "krbd-1"},
			wantHealable: false,
		},
		"recheck_after is passed on": {
			setup: func(t *testing.T, d *simulated.Driver) {
				must[simulated.Volume](t)(d.SetRecheckAfter("vol-1", 30*time.Second))
			},
			req:          &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-1"},
			wantHealable: true,
			wantRecheck:  30 * time.Second,
		},
		"empty volume id is INVALID_ARGUMENT": {
			req:      &healerv1alpha1.ProbeVolumeRequest{},
			wantCode: codes.InvalidArgument,
		},
		"unknown volume is NOT_FOUND": {
			req:      &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-404"},
			wantCode: codes.NotFound,
		},
		"volume not staged here is FAILED_PRECONDITION": {
			setup: func(t *testing.T, d *simulated.Driver) {
				must[simulated.Volume](t)(d.SetStaged("vol-1", false))
			},
			req:      &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-1"},
			wantCode: codes.FailedPrecondition,
		},
		"volume not staged at the given path is FAILED_PRECONDITION": {
			req:      &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-1", StagingTargetPath: "/elsewhere/globalmount"},
			wantCode: codes.FailedPrecondition,
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			n := startNode(t, simulated.Options{})
			if tt.setup != nil {
				tt.setup(t, n.d)
			}
			resp, err := n.healer.ProbeVolume(ctxT(t), tt.req)
			if got := status.Code(err); got != tt.wantCode {
				t.Fatalf("ProbeVolume() code = %s (%v), want %s", got, err, tt.wantCode)
			}
			if err != nil {
				return
			}
			if got := entries(resp.GetHealthStatuses()); !slices.Equal(got, tt.wantHealth) {
				t.Errorf("health = %v, want %v", got, tt.wantHealth)
			}
			if resp.GetHealable() != tt.wantHealable {
				t.Errorf("healable = %t, want %t", resp.GetHealable(), tt.wantHealable)
			}
			var recheck time.Duration
			if resp.GetRecheckAfter() != nil {
				recheck = resp.GetRecheckAfter().AsDuration()
			}
			if recheck != tt.wantRecheck {
				t.Errorf("recheck_after = %s, want %s", recheck, tt.wantRecheck)
			}
		})
	}
}

func TestHealVolume(t *testing.T) {
	tests := map[string]struct {
		opts          simulated.Options
		volume        simulated.VolumeSpec
		condition     control.Condition
		unstaged      bool
		wantCode      codes.Code
		wantHealth    []healthEntry
		wantCondition control.Condition
	}{
		"gone mount is remounted": {
			condition: control.Gone, wantCondition: control.Healthy,
		},
		"read-only mount is remounted": {
			condition: control.ReadOnly, wantCondition: control.Healthy,
		},
		"healthy volume is left alone": {
			condition: control.Healthy, wantCondition: control.Healthy,
		},
		"lost volume stays lost and says so": {
			condition:     control.Lost,
			wantHealth:    []healthEntry{{csi.VolumeHealthErrorType_DATA_LOSS, "DataLoss"}},
			wantCondition: control.Lost,
		},
		"kernel-mounted volume cannot be healed": {
			volume:    simulated.VolumeSpec{Mounter: "krbd"},
			condition: control.Gone, wantCode: codes.FailedPrecondition, wantCondition: control.Gone,
		},
		"volume not staged here is FAILED_PRECONDITION": {
			condition: control.Gone, unstaged: true, wantCode: codes.FailedPrecondition, wantCondition: control.Gone,
		},
		"heal not advertised is UNIMPLEMENTED": {
			opts:      simulated.Options{Capabilities: []healerv1alpha1.HealerCapability_RPC_Type{healerv1alpha1.HealerCapability_RPC_PROBE}},
			condition: control.Gone, wantCode: codes.Unimplemented, wantCondition: control.Gone,
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			n := startNode(t, tt.opts)
			spec := tt.volume
			spec.ID = "pvc-1"
			spec.NotStaged = tt.unstaged
			must[simulated.Volume](t)(n.d.AddVolume(spec))
			must[simulated.Volume](t)(n.d.SetCondition("pvc-1", tt.condition, 0))

			resp, err := n.healer.HealVolume(ctxT(t), &healerv1alpha1.HealVolumeRequest{VolumeId: "pvc-1"})
			if got := status.Code(err); got != tt.wantCode {
				t.Fatalf("HealVolume() code = %s (%v), want %s", got, err, tt.wantCode)
			}
			if err == nil {
				if got := entries(resp.GetHealthStatuses()); !slices.Equal(got, tt.wantHealth) {
					t.Errorf("health after heal = %v, want %v", got, tt.wantHealth)
				}
			}
			// The outcome must be on disk, not only in memory: a restarted driver sees it.
			var onDisk simulated.Volume
			b, err := os.ReadFile(filepath.Join(n.stateDir, "volumes", "pvc-1.json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &onDisk); err != nil {
				t.Fatal(err)
			}
			if onDisk.Condition != tt.wantCondition {
				t.Errorf("condition on disk = %s, want %s", onDisk.Condition, tt.wantCondition)
			}
		})
	}
}

// A hung volume holds its call in flight; meanwhile every other call on that volume is ABORTED
// and calls on other volumes go through. The fake clock decides when the hang ends.
func TestHungVolumeHoldsTheVolumeLock(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Now())
	n := startNode(t, simulated.Options{Clock: clk})
	ctx := ctxT(t)
	must[simulated.Volume](t)(n.d.SetCondition("vol-1", control.Hung, 10*time.Second))

	type answer struct {
		resp *healerv1alpha1.ProbeVolumeResponse
		err  error
	}
	first := make(chan answer, 1)
	go func() {
		resp, err := n.healer.ProbeVolume(ctx, &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-1"})
		first <- answer{resp, err}
	}()
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}

	_, err := n.healer.ProbeVolume(ctx, &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-1"})
	if status.Code(err) != codes.Aborted {
		t.Errorf("second ProbeVolume while one is in flight: %v, want ABORTED", err)
	}
	_, err = n.healer.HealVolume(ctx, &healerv1alpha1.HealVolumeRequest{VolumeId: "vol-1"})
	if status.Code(err) != codes.Aborted {
		t.Errorf("HealVolume while a probe is in flight: %v, want ABORTED", err)
	}
	if _, err := n.healer.ProbeVolume(ctx, &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-2"}); err != nil {
		t.Errorf("ProbeVolume of another volume: %v, want OK (the lock is per volume)", err)
	}
	if c := n.d.Counters(); c.InFlightPerVolume["vol-1"] != 1 || c.InFlight != 1 {
		t.Errorf("in flight during the hang = %d (vol-1: %d), want 1 (1)", c.InFlight, c.InFlightPerVolume["vol-1"])
	}

	clk.Step(10 * time.Second)
	a := <-first
	if a.err != nil {
		t.Fatalf("hung ProbeVolume: %v", a.err)
	}
	want := []healthEntry{{csi.VolumeHealthErrorType_INACCESSIBLE, "MountHung"}}
	if got := entries(a.resp.GetHealthStatuses()); !slices.Equal(got, want) {
		t.Errorf("hung probe health = %v, want %v", got, want)
	}

	c := n.d.Counters()
	checks := map[string]struct{ got, want int64 }{
		"max concurrent on vol-1":  {c.MaxConcurrentPerVolume["vol-1"], 2},
		"max concurrent on vol-2":  {c.MaxConcurrentPerVolume["vol-2"], 1},
		"max concurrent overall":   {c.MaxConcurrent, 2},
		"aborted on vol-1":         {c.Aborted["vol-1"], 2},
		"probes of vol-1":          {c.VolumeCalls["vol-1"]["ProbeVolume"], 2},
		"heals of vol-1":           {c.VolumeCalls["vol-1"]["HealVolume"], 1},
		"ProbeVolume calls":        {c.Calls["ProbeVolume"], 3},
		"in flight after the hang": {c.InFlight, 0},
	}
	for name, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %d, want %d", name, ch.got, ch.want)
		}
	}
	if len(c.InFlightPerVolume) != 0 {
		t.Errorf("in flight per volume after the hang = %v, want none", c.InFlightPerVolume)
	}
}

// A caller that gives up on a hung volume frees the volume's lock.
func TestCallerDeadlineReleasesHungVolume(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Now())
	n := startNode(t, simulated.Options{Clock: clk})
	must[simulated.Volume](t)(n.d.SetCondition("vol-1", control.Hung, time.Hour))

	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := n.healer.ProbeVolume(short, &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-1"})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("ProbeVolume of a hung volume with a short deadline: %v, want DEADLINE_EXCEEDED", err)
	}
	must[simulated.Volume](t)(n.d.SetCondition("vol-1", control.Healthy, 0))
	// The server notices the cancellation asynchronously; poll until the lock is free.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := n.healer.ProbeVolume(ctxT(t), &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-1"})
		if err == nil {
			break
		}
		if status.Code(err) != codes.Aborted || time.Now().After(deadline) {
			t.Fatalf("ProbeVolume after the caller gave up: %v, want OK", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The call log tells when each call ran and whether its caller had given up on it, through the
// Go API and the control interface alike.
func TestCallLog(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Now())
	n := startNode(t, simulated.Options{Clock: clk})
	ctx := ctxT(t)
	before := time.Now()
	if _, err := n.healer.ProbeVolume(ctx, &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.healer.HealVolume(ctx, &healerv1alpha1.HealVolumeRequest{VolumeId: "vol-2"}); err != nil {
		t.Fatal(err)
	}
	must[simulated.Volume](t)(n.d.SetCondition("vol-3", control.Hung, time.Hour))
	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := n.healer.ProbeVolume(short, &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-3"}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("ProbeVolume of a hung volume with a short deadline: %v, want DEADLINE_EXCEEDED", err)
	}
	// The server notices the caller's deadline asynchronously.
	deadline := time.Now().Add(5 * time.Second)
	for n.d.Counters().InFlight != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the abandoned call is still in flight after 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}

	type entry struct {
		rpc, volume string
		abandoned   bool
	}
	want := []entry{{"ProbeVolume", "vol-1", false}, {"HealVolume", "vol-2", false}, {"ProbeVolume", "vol-3", true}}
	fromControl, err := n.control.Calls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	logs := map[string][]control.Call{"Go API": n.d.Calls(), "control interface": fromControl}
	for name, calls := range logs {
		var got []entry
		for i, c := range calls {
			got = append(got, entry{c.RPC, c.VolumeID, c.Abandoned})
			if c.Start.Before(before) || c.End.Before(c.Start) {
				t.Errorf("%s: call %d ran from %s to %s; want an end after its start, both after %s", name, i, c.Start, c.End, before)
			}
			if i > 0 && c.Start.Before(calls[i-1].End) {
				t.Errorf("%s: call %d starts before call %d ended; they ran one after the other", name, i, i-1)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: call log = %+v, want %+v", name, got, want)
		}
	}

	n.d.ResetCounters()
	if calls := n.d.Calls(); len(calls) != 0 {
		t.Errorf("call log after ResetCounters = %+v, want empty", calls)
	}
}

func TestListStagedVolumes(t *testing.T) {
	n := startNode(t, simulated.Options{SeedVolumes: []string{"a", "b", "c", "d", "e"}})
	ctx := ctxT(t)
	must[simulated.Volume](t)(n.d.SetStaged("c", false))

	list := func(max int32, token string) (*healerv1alpha1.ListStagedVolumesResponse, error) {
		return n.healer.ListStagedVolumes(ctx, &healerv1alpha1.ListStagedVolumesRequest{MaxEntries: max, StartingToken: token})
	}
	ids := func(resp *healerv1alpha1.ListStagedVolumesResponse) []string {
		var out []string
		for _, e := range resp.GetEntries() {
			out = append(out, e.GetVolumeId())
		}
		return out
	}

	all := must[*healerv1alpha1.ListStagedVolumesResponse](t)(list(0, ""))
	if got, want := ids(all), []string{"a", "b", "d", "e"}; !slices.Equal(got, want) || all.GetNextToken() != "" {
		t.Errorf("whole listing = %v (next %q), want %v and no next token", got, all.GetNextToken(), want)
	}
	e := all.GetEntries()[0]
	if want := healerv1alpha1.StagingTargetPath(healerv1alpha1.DefaultKubeletCSIPluginDir, "healer.example.com", "a"); e.GetStagingTargetPath() != want {
		t.Errorf("staging path = %s, want the kubelet layout %s", e.GetStagingTargetPath(), want)
	}
	if e.GetVolumeContext()[simulated.MounterKey] != "rbd-nbd" {
		t.Errorf("volume context = %v, want the mounter", e.GetVolumeContext())
	}

	// Pages of two; volume "b" disappears and "bb" appears between the pages. Neither shifts
	// the listing: the rest comes exactly once.
	p1 := must[*healerv1alpha1.ListStagedVolumesResponse](t)(list(2, ""))
	if got := ids(p1); !slices.Equal(got, []string{"a", "b"}) || p1.GetNextToken() == "" {
		t.Fatalf("page 1 = %v (next %q), want [a b] and a next token", got, p1.GetNextToken())
	}
	if err := n.d.RemoveVolume("b"); err != nil {
		t.Fatal(err)
	}
	p2 := must[*healerv1alpha1.ListStagedVolumesResponse](t)(list(2, p1.GetNextToken()))
	if got := ids(p2); !slices.Equal(got, []string{"d", "e"}) || p2.GetNextToken() != "" {
		t.Errorf("page 2 = %v (next %q), want [d e] and no next token", got, p2.GetNextToken())
	}

	errs := map[string]struct {
		max   int32
		token string
		want  codes.Code
	}{
		"negative max_entries": {max: -1, want: codes.InvalidArgument},
		"foreign token":        {token: "not-a-token", want: codes.Aborted},
	}
	for name, tt := range errs {
		t.Run(name, func(t *testing.T) {
			if _, err := list(tt.max, tt.token); status.Code(err) != tt.want {
				t.Errorf("ListStagedVolumes: %v, want %s", err, tt.want)
			}
		})
	}
}

func TestIdentityAndCapabilities(t *testing.T) {
	n := startNode(t, simulated.Options{Identity: control.Identity{DriverName: "rbd.csi.example.org", NodeID: "worker-7"}, HealMounters: []string{"rbd-nbd"}})
	ctx := ctxT(t)

	id := must[*identity.GetIdentityResponse](t)(n.identity.GetIdentity(ctx, &identity.GetIdentityRequest{}))
	if id.GetName() != "rbd.csi.example.org" || id.GetVendorVersion() == "" {
		t.Errorf("GetIdentity = %q %q, want the configured name and a version", id.GetName(), id.GetVendorVersion())
	}
	if id.GetManifest()[healerv1alpha1.IdentityManifestKey] != healerv1alpha1.Version || id.GetManifest()["nodeID"] != "worker-7" {
		t.Errorf("manifest = %v, want the healer version and the node", id.GetManifest())
	}
	caps := must[*identity.GetCapabilitiesResponse](t)(n.identity.GetCapabilities(ctx, &identity.GetCapabilitiesRequest{}))
	if len(caps.GetCapabilities()) != 1 || caps.GetCapabilities()[0].GetService().GetType() != identity.Capability_Service_NODE_SERVICE {
		t.Errorf("identity capabilities = %v, want NODE_SERVICE", caps.GetCapabilities())
	}
	probe := must[*identity.ProbeResponse](t)(n.identity.Probe(ctx, &identity.ProbeRequest{}))
	if !probe.GetReady().GetValue() {
		t.Errorf("Probe ready = false, want true")
	}

	hc := must[*healerv1alpha1.GetHealerCapabilitiesResponse](t)(n.healer.GetHealerCapabilities(ctx, &healerv1alpha1.GetHealerCapabilitiesRequest{}))
	for _, rpc := range []healerv1alpha1.HealerCapability_RPC_Type{
		healerv1alpha1.HealerCapability_RPC_PROBE, healerv1alpha1.HealerCapability_RPC_HEAL, healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES,
	} {
		if !healerv1alpha1.HasRPC(hc.GetCapabilities(), rpc) {
			t.Errorf("%s not advertised", rpc)
		}
	}
	if hc.GetAttributes()["healMounters"] != "rbd-nbd" {
		t.Errorf("attributes = %v, want healMounters=rbd-nbd", hc.GetAttributes())
	}
	c := n.d.Counters()
	for _, rpc := range []string{"GetIdentity", "GetCapabilities", "Probe", "GetHealerCapabilities"} {
		if c.Calls[rpc] != 1 {
			t.Errorf("calls of %s = %d, want 1", rpc, c.Calls[rpc])
		}
	}
}

// The volumes, their conditions and removals survive a restart; the seed set is used only on
// the very first start.
func TestStateSurvivesRestart(t *testing.T) {
	state := t.TempDir()
	first := startNode(t, simulated.Options{StateDir: state})
	if got := len(first.d.Volumes()); got != 5 {
		t.Fatalf("first start has %d volumes, want the 5 default ones", got)
	}
	must[simulated.Volume](t)(first.d.SetCondition("vol-2", control.Gone, 0))
	must[simulated.Volume](t)(first.d.AddVolume(simulated.VolumeSpec{ID: "ns/pvc 1", Mounter: "krbd", NotStaged: true}))
	if err := first.d.RemoveVolume("vol-5"); err != nil {
		t.Fatal(err)
	}
	first.stop()

	second := startNode(t, simulated.Options{StateDir: state, SeedVolumes: []string{"other"}})
	var got []string
	for _, v := range second.d.Volumes() {
		got = append(got, v.ID)
	}
	if want := []string{"ns/pvc 1", "vol-1", "vol-2", "vol-3", "vol-4"}; !slices.Equal(got, want) {
		t.Errorf("volumes after restart = %v, want %v", got, want)
	}
	resp, err := second.healer.ProbeVolume(ctxT(t), &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-2"})
	if err != nil || len(resp.GetHealthStatuses()) == 0 {
		t.Errorf("probe of vol-2 after restart = %v, %v; want it still gone", resp, err)
	}
	v := must[simulated.Volume](t)(second.d.Volume("ns/pvc 1"))
	if v.Staged || second.d.Healable(v) {
		t.Errorf("ns/pvc 1 after restart: staged=%t healable=%t, want both false", v.Staged, second.d.Healable(v))
	}
}

func TestControlInterface(t *testing.T) {
	n := startNode(t, simulated.Options{})
	ctx := ctxT(t)
	c := n.control

	added, err := c.AddVolume(ctx, simulated.VolumeSpec{ID: "ns/pvc-9", Mounter: "fuse"})
	if err != nil {
		t.Fatalf("AddVolume: %v", err)
	}
	if !added.Staged || added.VolumeContext[simulated.MounterKey] != "fuse" {
		t.Errorf("added volume = %+v, want staged with mounter fuse", added)
	}
	if _, err := c.SetCondition(ctx, "ns/pvc-9", control.Hung, 3*time.Second); err != nil {
		t.Fatalf("SetCondition: %v", err)
	}
	// The control interface changes the driver the RPCs see.
	got := must[simulated.Volume](t)(n.d.Volume("ns/pvc-9"))
	if got.Condition != control.Hung || time.Duration(got.Hang) != 3*time.Second {
		t.Errorf("after SetCondition: %s for %s, want hung for 3s", got.Condition, time.Duration(got.Hang))
	}
	if _, err := c.SetStaged(ctx, "ns/pvc-9", false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetRecheckAfter(ctx, "ns/pvc-9", time.Minute); err != nil {
		t.Fatal(err)
	}
	v, err := c.Volume(ctx, "ns/pvc-9")
	if err != nil || v.Staged || time.Duration(v.RecheckAfter) != time.Minute {
		t.Errorf("Volume = %+v, %v; want unstaged with recheck after 1m", v, err)
	}

	errs := map[string]struct {
		call func() error
		want error
	}{
		"adding an existing volume":   {func() error { _, err := c.AddVolume(ctx, simulated.VolumeSpec{ID: "vol-1"}); return err }, control.ErrVolumeExists},
		"adding a volume without id":  {func() error { _, err := c.AddVolume(ctx, simulated.VolumeSpec{}); return err }, control.ErrInvalidRequest},
		"an unknown condition":        {func() error { _, err := c.SetCondition(ctx, "vol-1", "melted", 0); return err }, control.ErrInvalidRequest},
		"a negative hang":             {func() error { _, err := c.SetCondition(ctx, "vol-1", control.Hung, -time.Second); return err }, control.ErrInvalidRequest},
		"breaking an unknown volume":  {func() error { _, err := c.SetCondition(ctx, "vol-404", control.Gone, 0); return err }, control.ErrVolumeNotFound},
		"removing an unknown volume":  {func() error { return c.RemoveVolume(ctx, "vol-404") }, control.ErrVolumeNotFound},
		"reading an unknown volume":   {func() error { _, err := c.Volume(ctx, "vol-404"); return err }, control.ErrVolumeNotFound},
		"staging an unknown volume":   {func() error { _, err := c.SetStaged(ctx, "vol-404", true); return err }, control.ErrVolumeNotFound},
		"removing then reading again": {func() error { _ = c.RemoveVolume(ctx, "vol-3"); _, err := c.Volume(ctx, "vol-3"); return err }, control.ErrVolumeNotFound},
	}
	for name, tt := range errs {
		t.Run(name, func(t *testing.T) {
			if err := tt.call(); !errors.Is(err, tt.want) {
				t.Errorf("error = %v, want %v", err, tt.want)
			}
		})
	}

	if _, err := n.healer.ProbeVolume(ctx, &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-1"}); err != nil {
		t.Fatal(err)
	}
	counters, err := c.Counters(ctx)
	if err != nil || counters.VolumeCalls["vol-1"]["ProbeVolume"] != 1 || counters.MaxConcurrent != 1 {
		t.Errorf("Counters = %+v, %v; want one probe of vol-1", counters, err)
	}
	if err := c.ResetCounters(ctx); err != nil {
		t.Fatal(err)
	}
	if counters := n.d.Counters(); len(counters.Calls) != 0 || counters.MaxConcurrent != 0 {
		t.Errorf("after ResetCounters: %+v, want zero", counters)
	}
	vols, err := c.Volumes(ctx)
	if err != nil || len(vols) != 5 {
		t.Errorf("Volumes = %d volumes, %v; want 5 (4 seeded after one removal, plus one added)", len(vols), err)
	}
}

func TestServerShutdown(t *testing.T) {
	d, err := simulated.New(simulated.Options{StateDir: t.TempDir(), DefaultHang: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(socketDir(t), "csi-addons.sock")
	// A socket file left by a driver that died must not keep a new one from starting.
	abandonSocket(t, sock)
	srv, err := simulated.NewServer(d, simulated.ServerOptions{Endpoint: "unix://" + sock, ShutdownTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("NewServer over a stale socket: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()

	must[simulated.Volume](t)(d.SetCondition("vol-1", control.Hung, 0))
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	hung := make(chan error, 1)
	go func() {
		_, err := healerv1alpha1.NewHealerClient(conn).ProbeVolume(context.Background(), &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-1"})
		hung <- err
	}()
	for d.Counters().InFlight == 0 {
		time.Sleep(time.Millisecond)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Start = %v, want nil after shutdown", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Start did not return: a hung call kept the server up past its shutdown timeout")
	}
	if err := <-hung; err == nil {
		t.Errorf("the hung call succeeded; want it cut off by the shutdown")
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket file after shutdown: %v, want it removed", err)
	}
}

// abandonSocket leaves a socket file at path with nobody listening, as a killed process does.
func abandonSocket(t *testing.T, path string) {
	t.Helper()
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	lis.SetUnlinkOnClose(false)
	_ = lis.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("stale socket: %v", err)
	}
}

// TestKeptVolumes runs a driver that keeps its fuse volumes alive across node plugin restarts:
// it advertises the keeping, probes say kept for those volumes only, and a kept volume broken on
// purpose reports its condition and heals like any other.
func TestKeptVolumes(t *testing.T) {
	n := startNode(t, simulated.Options{
		SeedVolumes:   []string{},
		VolumeKeeping: []healerv1alpha1.HealerCapability_VolumeKeeping_Type{healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART},
		KeepMounters:  []string{"fuse"},
	})
	ctx := ctxT(t)
	must[simulated.Volume](t)(n.d.AddVolume(simulated.VolumeSpec{ID: "kept", Mounter: "fuse"}))
	must[simulated.Volume](t)(n.d.AddVolume(simulated.VolumeSpec{ID: "plain", Mounter: "rbd-nbd"}))

	hc := must[*healerv1alpha1.GetHealerCapabilitiesResponse](t)(n.healer.GetHealerCapabilities(ctx, &healerv1alpha1.GetHealerCapabilitiesRequest{}))
	if got := healerv1alpha1.VolumeKeepingOf(hc.GetCapabilities()); len(got) != 1 || got[0] != healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART {
		t.Errorf("advertised keeping = %v, want PLUGIN_RESTART", got)
	}
	for id, want := range map[string]bool{"kept": true, "plain": false} {
		resp := must[*healerv1alpha1.ProbeVolumeResponse](t)(n.healer.ProbeVolume(ctx, &healerv1alpha1.ProbeVolumeRequest{VolumeId: id}))
		if resp.GetKept() != want || len(resp.GetHealthStatuses()) != 0 {
			t.Errorf("ProbeVolume(%s) = %v; want healthy, kept=%t", id, resp, want)
		}
	}

	must[simulated.Volume](t)(n.d.SetCondition("kept", control.Gone, 0))
	resp := must[*healerv1alpha1.ProbeVolumeResponse](t)(n.healer.ProbeVolume(ctx, &healerv1alpha1.ProbeVolumeRequest{VolumeId: "kept"}))
	if !resp.GetKept() || !resp.GetHealable() || len(resp.GetHealthStatuses()) != 1 || resp.GetHealthStatuses()[0].GetReason() != "MountGone" {
		t.Errorf("ProbeVolume of a kept volume whose mount is gone = %v; want MountGone, healable, kept", resp)
	}
	healed := must[*healerv1alpha1.HealVolumeResponse](t)(n.healer.HealVolume(ctx, &healerv1alpha1.HealVolumeRequest{VolumeId: "kept"}))
	if len(healed.GetHealthStatuses()) != 0 {
		t.Errorf("HealVolume of a broken kept volume = %v; want it healed", healed)
	}
}

func TestNewRejectsInvalidKeeping(t *testing.T) {
	tests := map[string]simulated.Options{
		"UNKNOWN keeping": {VolumeKeeping: []healerv1alpha1.HealerCapability_VolumeKeeping_Type{healerv1alpha1.HealerCapability_VolumeKeeping_UNKNOWN}},
		"keeping twice": {VolumeKeeping: []healerv1alpha1.HealerCapability_VolumeKeeping_Type{
			healerv1alpha1.HealerCapability_VolumeKeeping_MOUNTER_RESTART, healerv1alpha1.HealerCapability_VolumeKeeping_MOUNTER_RESTART}},
		"kept mounters without keeping": {KeepMounters: []string{"fuse"}},
	}
	for name, opts := range tests {
		t.Run(name, func(t *testing.T) {
			opts.StateDir = t.TempDir()
			if _, err := simulated.New(opts); !errors.Is(err, control.ErrInvalidOptions) {
				t.Errorf("New = %v, want ErrInvalidOptions", err)
			}
		})
	}
}

func TestNewRejectsMissingStateDir(t *testing.T) {
	if _, err := simulated.New(simulated.Options{}); !errors.Is(err, control.ErrInvalidOptions) {
		t.Errorf("New without StateDir = %v, want ErrInvalidOptions", err)
	}
}
