package sanity_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csi-addons/spec/lib/go/identity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/volume-healer/volume-healer/api/healer/sanity"
	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
)

// allChecks is every check a run against a complete driver with a control reports.
var allChecks = []string{
	sanity.CheckIdentity, sanity.CheckIdentityAdvertises, sanity.CheckCapabilities,
	sanity.CheckProbeEmptyVolumeID, sanity.CheckProbeUnknownVolume,
	sanity.CheckHealEmptyVolumeID, sanity.CheckHealUnknownVolume,
	sanity.CheckProbeHealthyVolume, sanity.CheckWrongStagingPath, sanity.CheckRPCsMatchCapabilities,
	sanity.CheckHealHealthyVolume, sanity.CheckProbeBrokenVolume, sanity.CheckHealBrokenVolume,
	sanity.CheckHealDataLoss, sanity.CheckNotStagedVolume, sanity.CheckConcurrentCallsAborted,
	sanity.CheckListStagedVolumes, sanity.CheckVolumeKeeping, sanity.CheckHealthVocabulary,
}

func socketDir(t *testing.T) string {
	t.Helper()
	// Short on purpose: UNIX socket paths must stay under 108 bytes.
	dir, err := os.MkdirTemp("", "sanity")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func newDriver(t *testing.T, opts simulated.Options) *simulated.Driver {
	t.Helper()
	opts.StateDir = t.TempDir()
	d, err := simulated.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// startReference serves the reference driver as it runs in production: its own server, a
// control socket, and sanity talking to both over real sockets.
func startReference(t *testing.T, d *simulated.Driver) (endpoint string, ctl sanity.VolumeControl) {
	t.Helper()
	dir := socketDir(t)
	endpoint = "unix://" + filepath.Join(dir, "csi-addons.sock")
	controlEndpoint := "unix://" + filepath.Join(dir, "control.sock")
	srv, err := simulated.NewServer(d, simulated.ServerOptions{Endpoint: endpoint, ControlEndpoint: controlEndpoint})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("driver server: %v", err)
		}
	})
	ctl, err = sanity.NewHTTPControl(controlEndpoint)
	if err != nil {
		t.Fatal(err)
	}
	return endpoint, ctl
}

// startCustom serves identity and healer implementations (faulty ones, typically) on a socket;
// with h nil, no Healer service, as a driver that has not adopted the protocol.
func startCustom(t *testing.T, id identity.IdentityServer, h healerv1alpha1.HealerServer) string {
	t.Helper()
	path := filepath.Join(socketDir(t), "csi-addons.sock")
	lis, err := net.Listen("unix", path)
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
	return "unix://" + path
}

// directControl drives an in-process reference driver through its Go API.
type directControl struct{ d *simulated.Driver }

func (c directControl) SetFault(_ context.Context, id string, f sanity.Fault, hang time.Duration) error {
	_, err := c.d.SetCondition(id, control.Condition(f), hang)
	return err
}

func (c directControl) SetStaged(_ context.Context, id string, staged bool) error {
	_, err := c.d.SetStaged(id, staged)
	return err
}

func run(t *testing.T, opts sanity.Options) (sanity.Report, string) {
	t.Helper()
	var out bytes.Buffer
	opts.Out = &out
	if opts.HangFor == 0 {
		opts.HangFor = 300 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	report, err := sanity.Run(ctx, opts)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return report, out.String()
}

func names(report sanity.Report, o sanity.Outcome) []string {
	var out []string
	for _, r := range report.Results {
		if r.Outcome == o {
			out = append(out, r.Check)
		}
	}
	return out
}

func TestReferenceDriverPassesEveryCheck(t *testing.T) {
	d := newDriver(t, simulated.Options{})
	endpoint, ctl := startReference(t, d)

	report, out := run(t, sanity.Options{Endpoint: endpoint, Control: ctl})
	if !report.Passed() || report.Count(sanity.Skip) != 0 {
		t.Fatalf("failed %v, skipped %v; want every check to pass:\n%s", names(report, sanity.Fail), names(report, sanity.Skip), out)
	}
	var got []string
	for _, r := range report.Results {
		got = append(got, r.Check)
	}
	if !slices.Equal(got, allChecks) {
		t.Errorf("checks run = %v, want %v", got, allChecks)
	}
	for _, check := range allChecks {
		if !strings.Contains(out, "PASS "+check+": ") {
			t.Errorf("output has no line %q:\n%s", "PASS "+check+": ...", out)
		}
	}
	if report.Tier != sanity.TierHealer || !strings.Contains(out, "TIER healer: the driver serves the Healer service with HEAL") {
		t.Errorf("tier = %q, want healer, printed:\n%s", report.Tier, out)
	}
	// The run leaves the volume as it found it.
	v, err := d.Volume("vol-1")
	if err != nil || v.Condition != control.Healthy || !v.Staged {
		t.Errorf("vol-1 after the run = %+v, %v; want healthy and staged", v, err)
	}
	// Sanity never sends two calls on a volume at once, except in the check that means to.
	c := d.Counters()
	if c.Aborted["vol-1"] != 2 {
		t.Errorf("ABORTED answers on vol-1 = %d, want the 2 the concurrency check provokes", c.Aborted["vol-1"])
	}
}

// TestKeepingDriver: a driver that keeps its volumes alive across node plugin restarts passes
// every check, and the keeping check says that its healthy volume probed healthy and kept; given
// a volume it does not keep, the keeping check is skipped with words that say why.
func TestKeepingDriver(t *testing.T) {
	d := newDriver(t, simulated.Options{
		VolumeKeeping: []healerv1alpha1.HealerCapability_VolumeKeeping_Type{healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART},
		KeepMounters:  []string{"rbd-nbd"},
	})
	if _, err := d.AddVolume(simulated.VolumeSpec{ID: "krbd-1", Mounter: "krbd"}); err != nil {
		t.Fatal(err)
	}
	endpoint, ctl := startReference(t, d)

	report, out := run(t, sanity.Options{Endpoint: endpoint, Control: ctl, VolumeID: "vol-1"})
	if !report.Passed() || report.Count(sanity.Skip) != 0 {
		t.Fatalf("failed %v, skipped %v; want every check to pass:\n%s", names(report, sanity.Fail), names(report, sanity.Skip), out)
	}
	res, _ := report.Result(sanity.CheckVolumeKeeping)
	if !strings.Contains(res.Detail, "PLUGIN_RESTART") || !strings.Contains(res.Detail, "probes healthy and kept") {
		t.Errorf("keeping check says %q; want it to name PLUGIN_RESTART and the healthy kept probe", res.Detail)
	}
	if res, _ := report.Result(sanity.CheckCapabilities); !strings.Contains(res.Detail, "VolumeKeeping PLUGIN_RESTART") {
		t.Errorf("capabilities check says %q; want it to list the volume keeping", res.Detail)
	}

	report, out = run(t, sanity.Options{Endpoint: endpoint, VolumeID: "krbd-1"})
	res, _ = report.Result(sanity.CheckVolumeKeeping)
	if !report.Passed() || res.Outcome != sanity.Skip || !strings.Contains(res.Detail, "not kept") {
		t.Errorf("a volume the driver does not keep: keeping check %+v; want a pass with it skipped as not kept:\n%s", res, out)
	}
}

func TestWithoutControlBrokenVolumeChecksAreSkippedLoudly(t *testing.T) {
	d := newDriver(t, simulated.Options{})
	endpoint, _ := startReference(t, d)

	report, out := run(t, sanity.Options{Endpoint: endpoint, VolumeID: "vol-3"})
	if !report.Passed() {
		t.Fatalf("failed %v; want a pass with skips:\n%s", names(report, sanity.Fail), out)
	}
	wantSkipped := []string{sanity.CheckProbeBrokenVolume, sanity.CheckHealBrokenVolume, sanity.CheckHealDataLoss, sanity.CheckNotStagedVolume}
	skipped := names(report, sanity.Skip)
	for _, check := range wantSkipped {
		if !slices.Contains(skipped, check) {
			t.Errorf("%s not skipped without a control (skipped: %v)", check, skipped)
		}
		if res, _ := report.Result(check); !strings.Contains(res.Detail, "no control") {
			t.Errorf("%s skip reason %q does not name the missing control", check, res.Detail)
		}
	}
	if !strings.Contains(out, "WARNING:") || !strings.Contains(out, "SKIPPED") {
		t.Errorf("output does not warn about the skipped checks:\n%s", out)
	}
	if !strings.Contains(out, `using volume "vol-3" (given)`) {
		t.Errorf("output does not name the volume under test:\n%s", out)
	}
}

func TestDriverVariants(t *testing.T) {
	tests := map[string]struct {
		opts        simulated.Options
		addVolume   *simulated.VolumeSpec
		volume      string
		wantSkipped []string
	}{
		"a volume the driver cannot heal": {
			addVolume:   &simulated.VolumeSpec{ID: "krbd-1", Mounter: "krbd"},
			volume:      "krbd-1",
			wantSkipped: []string{sanity.CheckHealBrokenVolume, sanity.CheckHealDataLoss},
		},
		"a driver that only probes and lists": {
			opts: simulated.Options{Capabilities: []healerv1alpha1.HealerCapability_RPC_Type{
				healerv1alpha1.HealerCapability_RPC_PROBE, healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES,
			}},
			wantSkipped: []string{sanity.CheckHealEmptyVolumeID, sanity.CheckHealUnknownVolume, sanity.CheckHealHealthyVolume,
				sanity.CheckHealBrokenVolume, sanity.CheckHealDataLoss},
		},
		"a driver that cannot list, given a volume": {
			opts: simulated.Options{Capabilities: []healerv1alpha1.HealerCapability_RPC_Type{
				healerv1alpha1.HealerCapability_RPC_PROBE, healerv1alpha1.HealerCapability_RPC_HEAL,
			}},
			volume:      "vol-2",
			wantSkipped: []string{sanity.CheckListStagedVolumes},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			d := newDriver(t, tt.opts)
			if tt.addVolume != nil {
				if _, err := d.AddVolume(*tt.addVolume); err != nil {
					t.Fatal(err)
				}
			}
			endpoint := startCustom(t, d.IdentityServer(), d.HealerServer())
			report, out := run(t, sanity.Options{Endpoint: endpoint, VolumeID: tt.volume, Control: directControl{d}})
			if !report.Passed() {
				t.Fatalf("failed %v; want a pass:\n%s", names(report, sanity.Fail), out)
			}
			if got := names(report, sanity.Skip); !slices.Equal(got, tt.wantSkipped) {
				t.Errorf("skipped %v, want %v:\n%s", got, tt.wantSkipped, out)
			}
		})
	}
}

// Each faulty driver is the reference driver with one promise broken; sanity must fail exactly
// the checks that verify that promise.
func TestFaultyDriversFailTheBrokenCheck(t *testing.T) {
	tests := map[string]struct {
		identity   func(identity.IdentityServer) identity.IdentityServer
		healer     func(healerv1alpha1.HealerServer) healerv1alpha1.HealerServer
		wantFailed []string
	}{
		"unknown volume answers OK instead of NOT_FOUND": {
			healer:     func(h healerv1alpha1.HealerServer) healerv1alpha1.HealerServer { return okForUnknown{h} },
			wantFailed: []string{sanity.CheckProbeUnknownVolume},
		},
		"empty volume id answers NOT_FOUND instead of INVALID_ARGUMENT": {
			healer:     func(h healerv1alpha1.HealerServer) healerv1alpha1.HealerServer { return notFoundForEmptyID{h} },
			wantFailed: []string{sanity.CheckProbeEmptyVolumeID},
		},
		"busy volume is never ABORTED": {
			healer:     func(h healerv1alpha1.HealerServer) healerv1alpha1.HealerServer { return neverAborted{h} },
			wantFailed: []string{sanity.CheckConcurrentCallsAborted},
		},
		"heal reports success without repairing": {
			healer:     func(h healerv1alpha1.HealerServer) healerv1alpha1.HealerServer { return healDoesNothing{h} },
			wantFailed: []string{sanity.CheckHealBrokenVolume, sanity.CheckHealDataLoss},
		},
		"health reasons are not CamelCase": {
			healer:     func(h healerv1alpha1.HealerServer) healerv1alpha1.HealerServer { return lowercaseReasons{h} },
			wantFailed: []string{sanity.CheckProbeBrokenVolume, sanity.CheckHealthVocabulary},
		},
		"heal is served but not advertised": {
			healer:     func(h healerv1alpha1.HealerServer) healerv1alpha1.HealerServer { return hidesHeal{h} },
			wantFailed: []string{sanity.CheckRPCsMatchCapabilities},
		},
		"kept without advertising volume keeping": {
			healer:     func(h healerv1alpha1.HealerServer) healerv1alpha1.HealerServer { return keptWithoutKeeping{h} },
			wantFailed: []string{sanity.CheckVolumeKeeping},
		},
		"listing ignores max_entries": {
			healer:     func(h healerv1alpha1.HealerServer) healerv1alpha1.HealerServer { return ignoresMaxEntries{h} },
			wantFailed: []string{sanity.CheckListStagedVolumes},
		},
		"volume not staged here is probed anyway": {
			healer:     func(h healerv1alpha1.HealerServer) healerv1alpha1.HealerServer { return ignoresStaging{h} },
			wantFailed: []string{sanity.CheckWrongStagingPath, sanity.CheckNotStagedVolume},
		},
		"identity does not announce the healer": {
			identity:   func(i identity.IdentityServer) identity.IdentityServer { return noManifest{i} },
			wantFailed: []string{sanity.CheckIdentityAdvertises},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			d := newDriver(t, simulated.Options{})
			id, h := d.IdentityServer(), d.HealerServer()
			if tt.identity != nil {
				id = tt.identity(id)
			}
			if tt.healer != nil {
				h = tt.healer(h)
			}
			endpoint := startCustom(t, id, h)

			report, out := run(t, sanity.Options{Endpoint: endpoint, Control: directControl{d}})
			if report.Passed() {
				t.Fatalf("the run passed against a faulty driver:\n%s", out)
			}
			if got := names(report, sanity.Fail); !slices.Equal(got, tt.wantFailed) {
				t.Errorf("failed %v, want %v:\n%s", got, tt.wantFailed, out)
			}
			for _, check := range tt.wantFailed {
				if !strings.Contains(out, "FAIL "+check+": ") {
					t.Errorf("output does not name the broken check %s:\n%s", check, out)
				}
			}
		})
	}
}

// The tier a driver gets is printed from what it serves, and a driver that serves no Healer
// service at all passes: it is not broken, it is helped by the sidecar's own probe.
func TestTierOfEachDriver(t *testing.T) {
	probeOnly := simulated.Options{Capabilities: []healerv1alpha1.HealerCapability_RPC_Type{
		healerv1alpha1.HealerCapability_RPC_PROBE, healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES,
	}}
	tests := map[string]struct {
		opts     simulated.Options
		noHealer bool
		identity func(identity.IdentityServer) identity.IdentityServer
		wantTier sanity.Tier
		wantLine string
		// wantFailed and wantSkipped are the checks that fail and, when set, those skipped.
		wantFailed  []string
		wantSkipped []string
	}{
		"probe and heal": {
			wantTier: sanity.TierHealer,
			wantLine: "TIER healer: the driver serves the Healer service with HEAL: volume-healer probes its volumes through it and heals them in place",
		},
		"probe only": {
			opts:     probeOnly,
			wantTier: sanity.TierProbeOnly,
			wantLine: "TIER probe-only: the driver serves PROBE and no HEAL: volume-healer probes its volumes through it and cannot heal them in place",
		},
		"no Healer service, as an unmodified driver": {
			noHealer:    true,
			identity:    func(i identity.IdentityServer) identity.IdentityServer { return noManifest{i} },
			wantTier:    sanity.TierNone,
			wantLine:    "TIER none: the driver serves no Healer probe: the healer sidecar probes its volumes itself, on the node, and nothing heals them in place",
			wantSkipped: []string{sanity.CheckIdentityAdvertises, sanity.CheckCapabilities},
		},
		"no Healer service, though the identity announces it": {
			noHealer:    true,
			wantTier:    sanity.TierNone,
			wantLine:    "TIER none: ",
			wantFailed:  []string{sanity.CheckIdentityAdvertises},
			wantSkipped: []string{sanity.CheckCapabilities},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			d := newDriver(t, tt.opts)
			id, h := d.IdentityServer(), d.HealerServer()
			if tt.identity != nil {
				id = tt.identity(id)
			}
			if tt.noHealer {
				h = nil
			}
			endpoint := startCustom(t, id, h)
			report, out := run(t, sanity.Options{Endpoint: endpoint, Control: directControl{d}})
			if report.Tier != tt.wantTier {
				t.Errorf("tier = %q, want %q:\n%s", report.Tier, tt.wantTier, out)
			}
			if !strings.Contains(out, "\n"+tt.wantLine) {
				t.Errorf("output has no line starting %q:\n%s", tt.wantLine, out)
			}
			if got := names(report, sanity.Fail); !slices.Equal(got, tt.wantFailed) {
				t.Errorf("failed %v, want %v:\n%s", got, tt.wantFailed, out)
			}
			if report.Passed() != (len(tt.wantFailed) == 0) {
				t.Errorf("passed = %t, want %t", report.Passed(), len(tt.wantFailed) == 0)
			}
			if tt.noHealer {
				if got := names(report, sanity.Skip); !slices.Equal(got, tt.wantSkipped) {
					t.Errorf("skipped %v, want %v:\n%s", got, tt.wantSkipped, out)
				}
				if !strings.Contains(out, "SKIP "+sanity.CheckCapabilities+": GetHealerCapabilities: UNIMPLEMENTED") {
					t.Errorf("output does not say that GetHealerCapabilities is UNIMPLEMENTED:\n%s", out)
				}
			}
		})
	}
}

func TestUnreachableDriverFailsAtOnce(t *testing.T) {
	endpoint := "unix://" + filepath.Join(socketDir(t), "nobody.sock")
	report, out := run(t, sanity.Options{Endpoint: endpoint, CallTimeout: time.Second})
	if report.Passed() || len(report.Results) != 1 || report.Results[0].Check != sanity.CheckIdentity {
		t.Errorf("results = %v, want a single failed identity check:\n%s", report.Results, out)
	}
}

// TestDriverWithoutHealer: a driver that serves the CSI-Addons Identity and no Healer service
// (any CSI driver as it ships) is no failure: the capabilities check is skipped with words that
// say so and name the tier it gets, and no Healer check runs after it.
func TestDriverWithoutHealer(t *testing.T) {
	d := newDriver(t, simulated.Options{})
	path := filepath.Join(socketDir(t), "csi-addons.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	identity.RegisterIdentityServer(s, d.IdentityServer())
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)

	report, out := run(t, sanity.Options{Endpoint: "unix://" + path})
	res, ok := report.Result(sanity.CheckCapabilities)
	if !ok || res.Outcome != sanity.Skip || report.Tier != sanity.TierNone ||
		!strings.Contains(res.Detail, "the driver serves no Healer service") || !strings.Contains(res.Detail, "tier none") ||
		!strings.Contains(res.Detail, "UNIMPLEMENTED") {
		t.Errorf("capabilities check %+v, tier %q; want it skipped saying the driver serves no Healer service (tier none):\n%s", res, report.Tier, out)
	}
	if last := report.Results[len(report.Results)-1]; last.Check != sanity.CheckCapabilities {
		t.Errorf("the run went on after the capabilities check, to %s:\n%s", last.Check, out)
	}
}

func TestInvalidOptions(t *testing.T) {
	tests := map[string]sanity.Options{
		"no endpoint":         {},
		"a TCP endpoint":      {Endpoint: "dns:///driver:9000"},
		"a negative duration": {Endpoint: "unix:///tmp/x.sock", CallTimeout: -time.Second},
	}
	for name, opts := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := sanity.Run(context.Background(), opts); !errors.Is(err, sanity.ErrInvalidOptions) {
				t.Errorf("Run = %v, want ErrInvalidOptions", err)
			}
		})
	}
}

// --- faulty drivers: the reference driver with one promise broken ---

type okForUnknown struct{ healerv1alpha1.HealerServer }

func (f okForUnknown) ProbeVolume(ctx context.Context, req *healerv1alpha1.ProbeVolumeRequest) (*healerv1alpha1.ProbeVolumeResponse, error) {
	resp, err := f.HealerServer.ProbeVolume(ctx, req)
	if status.Code(err) == codes.NotFound {
		return &healerv1alpha1.ProbeVolumeResponse{}, nil
	}
	return resp, err
}

type notFoundForEmptyID struct{ healerv1alpha1.HealerServer }

func (f notFoundForEmptyID) ProbeVolume(ctx context.Context, req *healerv1alpha1.ProbeVolumeRequest) (*healerv1alpha1.ProbeVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.NotFound, "no such volume")
	}
	return f.HealerServer.ProbeVolume(ctx, req)
}

// neverAborted answers a busy volume as if it were healthy, like a driver without a lock.
type neverAborted struct{ healerv1alpha1.HealerServer }

func (f neverAborted) ProbeVolume(ctx context.Context, req *healerv1alpha1.ProbeVolumeRequest) (*healerv1alpha1.ProbeVolumeResponse, error) {
	resp, err := f.HealerServer.ProbeVolume(ctx, req)
	if status.Code(err) == codes.Aborted {
		return &healerv1alpha1.ProbeVolumeResponse{Healable: true}, nil
	}
	return resp, err
}

func (f neverAborted) HealVolume(ctx context.Context, req *healerv1alpha1.HealVolumeRequest) (*healerv1alpha1.HealVolumeResponse, error) {
	resp, err := f.HealerServer.HealVolume(ctx, req)
	if status.Code(err) == codes.Aborted {
		return &healerv1alpha1.HealVolumeResponse{}, nil
	}
	return resp, err
}

// healDoesNothing makes every check a heal would make, then claims success without healing.
type healDoesNothing struct{ healerv1alpha1.HealerServer }

func (f healDoesNothing) HealVolume(ctx context.Context, req *healerv1alpha1.HealVolumeRequest) (*healerv1alpha1.HealVolumeResponse, error) {
	probe, err := f.ProbeVolume(ctx, &healerv1alpha1.ProbeVolumeRequest{VolumeId: req.GetVolumeId(), StagingTargetPath: req.GetStagingTargetPath()})
	if err != nil {
		return nil, err
	}
	if !probe.GetHealable() {
		return nil, status.Error(codes.FailedPrecondition, "not healable")
	}
	return &healerv1alpha1.HealVolumeResponse{}, nil
}

type lowercaseReasons struct{ healerv1alpha1.HealerServer }

func (f lowercaseReasons) ProbeVolume(ctx context.Context, req *healerv1alpha1.ProbeVolumeRequest) (*healerv1alpha1.ProbeVolumeResponse, error) {
	resp, err := f.HealerServer.ProbeVolume(ctx, req)
	for _, e := range resp.GetHealthStatuses() {
		e.Reason = strings.ToLower(e.GetReason())
	}
	return resp, err
}

type hidesHeal struct{ healerv1alpha1.HealerServer }

func (f hidesHeal) GetHealerCapabilities(ctx context.Context, req *healerv1alpha1.GetHealerCapabilitiesRequest) (*healerv1alpha1.GetHealerCapabilitiesResponse, error) {
	resp, err := f.HealerServer.GetHealerCapabilities(ctx, req)
	if err != nil {
		return nil, err
	}
	resp.Capabilities = slices.DeleteFunc(resp.Capabilities, func(c *healerv1alpha1.HealerCapability) bool {
		return c.GetRpc().GetType() == healerv1alpha1.HealerCapability_RPC_HEAL
	})
	return resp, nil
}

// keptWithoutKeeping says kept=true in every probe but advertises no volume keeping.
type keptWithoutKeeping struct{ healerv1alpha1.HealerServer }

func (f keptWithoutKeeping) ProbeVolume(ctx context.Context, req *healerv1alpha1.ProbeVolumeRequest) (*healerv1alpha1.ProbeVolumeResponse, error) {
	resp, err := f.HealerServer.ProbeVolume(ctx, req)
	if resp != nil {
		resp.Kept = true
	}
	return resp, err
}

type ignoresMaxEntries struct{ healerv1alpha1.HealerServer }

func (f ignoresMaxEntries) ListStagedVolumes(ctx context.Context, req *healerv1alpha1.ListStagedVolumesRequest) (*healerv1alpha1.ListStagedVolumesResponse, error) {
	if req.GetMaxEntries() > 0 {
		req = &healerv1alpha1.ListStagedVolumesRequest{StartingToken: req.GetStartingToken()}
	}
	return f.HealerServer.ListStagedVolumes(ctx, req)
}

// ignoresStaging probes volumes whether or not they are staged here.
type ignoresStaging struct{ healerv1alpha1.HealerServer }

func (f ignoresStaging) ProbeVolume(ctx context.Context, req *healerv1alpha1.ProbeVolumeRequest) (*healerv1alpha1.ProbeVolumeResponse, error) {
	resp, err := f.HealerServer.ProbeVolume(ctx, req)
	if status.Code(err) == codes.FailedPrecondition {
		return &healerv1alpha1.ProbeVolumeResponse{Healable: true}, nil
	}
	return resp, err
}

type noManifest struct{ identity.IdentityServer }

func (f noManifest) GetIdentity(ctx context.Context, req *identity.GetIdentityRequest) (*identity.GetIdentityResponse, error) {
	resp, err := f.IdentityServer.GetIdentity(ctx, req)
	if err != nil {
		return nil, err
	}
	resp.Manifest = nil
	return resp, nil
}
