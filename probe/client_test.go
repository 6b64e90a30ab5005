package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-healer/volume-healer/api/annotations"
	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// fakeSidecar serves NodeHealer with scripted answers and records what it saw.
type fakeSidecar struct {
	healerv1alpha1.UnimplementedNodeHealerServer
	mu        sync.Mutex
	tokens    []string
	capsCalls int
	probeErr  error
	probe     *healerv1alpha1.NodeProbeVolumeResponse
	hang      time.Duration
	// capsHang holds each capabilities call this long, or until the caller gives up.
	capsHang time.Duration
	pages    map[string]*healerv1alpha1.NodeListStagedVolumesResponse
	// list, when set, answers ListStagedVolumes instead of pages.
	list func(ctx context.Context, token string) (*healerv1alpha1.NodeListStagedVolumesResponse, error)
	// deadlines holds, per call seen, the time its deadline left it when it arrived.
	deadlines []time.Duration
}

func (f *fakeSidecar) seen(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens = append(f.tokens, md.Get("authorization")...)
	if deadline, ok := ctx.Deadline(); ok {
		f.deadlines = append(f.deadlines, time.Until(deadline))
	} else {
		f.deadlines = append(f.deadlines, 0)
	}
}

func (f *fakeSidecar) GetHealerCapabilities(ctx context.Context, _ *healerv1alpha1.NodeGetHealerCapabilitiesRequest) (*healerv1alpha1.NodeGetHealerCapabilitiesResponse, error) {
	f.seen(ctx)
	f.mu.Lock()
	f.capsCalls++
	hang := f.capsHang
	f.mu.Unlock()
	if hang > 0 {
		select {
		case <-time.After(hang):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &healerv1alpha1.NodeGetHealerCapabilitiesResponse{
		DriverName: "rbd.csi.ceph.com",
		NodeName:   "node-a",
		Capabilities: []*healerv1alpha1.HealerCapability{
			healerv1alpha1.NewRPCCapability(healerv1alpha1.HealerCapability_RPC_PROBE),
			healerv1alpha1.NewRPCCapability(healerv1alpha1.HealerCapability_RPC_HEAL),
		},
		Attributes: map[string]string{"healMounters": "rbd-nbd"},
	}, nil
}

func (f *fakeSidecar) ProbeVolume(ctx context.Context, req *healerv1alpha1.NodeProbeVolumeRequest) (*healerv1alpha1.NodeProbeVolumeResponse, error) {
	f.seen(ctx)
	if f.hang > 0 {
		select {
		case <-time.After(f.hang):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if f.probeErr != nil {
		return nil, f.probeErr
	}
	return f.probe, nil
}

func (f *fakeSidecar) ListStagedVolumes(ctx context.Context, req *healerv1alpha1.NodeListStagedVolumesRequest) (*healerv1alpha1.NodeListStagedVolumesResponse, error) {
	f.seen(ctx)
	if f.list != nil {
		return f.list(ctx, req.GetStartingToken())
	}
	return f.pages[req.GetStartingToken()], nil
}

// countingListener counts accepted connections, to see that the client pools them.
type countingListener struct {
	net.Listener
	accepted atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

func serve(t *testing.T, f *fakeSidecar) (Target, *countingListener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	srv := grpc.NewServer()
	healerv1alpha1.RegisterNodeHealerServer(srv, f)
	go func() { _ = srv.Serve(cl) }()
	t.Cleanup(srv.Stop)
	return Target{Driver: "rbd.csi.ceph.com", Node: "node-a", Endpoint: ln.Addr().String()}, cl
}

func TestProbeResultAndPooling(t *testing.T) {
	f := &fakeSidecar{probe: &healerv1alpha1.NodeProbeVolumeResponse{
		VolumeId: "0001-abc",
		HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{
			{Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "MountGone", Message: "rbd-nbd died"},
			{Status: csi.VolumeHealthErrorType(42), Reason: "FutureThing"},
		},
		Healable:     true,
		RecheckAfter: durationpb.New(90 * time.Second),
	}}
	target, ln := serve(t, f)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("tok-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fc := clocktesting.NewFakePassiveClock(time.Now())
	c := New(Options{TokenFile: tokenFile, Clock: fc})
	defer c.Close()
	ctx := context.Background()

	for i := 0; i < 5; i++ {
		res, err := c.Probe(ctx, target, "pvc-1")
		if err != nil {
			t.Fatal(err)
		}
		if res.Healthy() || !res.Has("INACCESSIBLE") || !res.Healable || res.RecheckAfter != 90*time.Second || res.VolumeID != "0001-abc" {
			t.Fatalf("probe result = %+v", res)
		}
		if res.Health[1].Status != "UNKNOWN_42" {
			t.Errorf("an unknown status is surfaced as %q, want UNKNOWN_42", res.Health[1].Status)
		}
	}
	if n := ln.accepted.Load(); n != 1 {
		t.Errorf("5 probes opened %d connections, want 1 pooled connection", n)
	}

	// A rotated token is sent once the refresh interval has passed, not before.
	if err := os.WriteFile(tokenFile, []byte("tok-2"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Probe(ctx, target, "pvc-1"); err != nil {
		t.Fatal(err)
	}
	fc.SetTime(fc.Now().Add(2 * time.Minute))
	if _, err := c.Probe(ctx, target, "pvc-1"); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	tokens := append([]string(nil), f.tokens...)
	f.mu.Unlock()
	if len(tokens) != 7 || tokens[0] != "Bearer tok-1" || tokens[5] != "Bearer tok-1" || tokens[6] != "Bearer tok-2" {
		t.Errorf("tokens seen = %v, want tok-1 six times then tok-2", tokens)
	}

	// Forget drops the connection: the next call dials again.
	c.Forget(target.Endpoint)
	if _, err := c.Probe(ctx, target, "pvc-1"); err != nil {
		t.Fatal(err)
	}
	if n := ln.accepted.Load(); n != 2 {
		t.Errorf("after Forget: %d connections, want 2", n)
	}
}

func TestClassify(t *testing.T) {
	tests := map[string]struct {
		code      codes.Code
		want      error
		retryable bool
	}{
		"busy volume":      {codes.Aborted, ErrBusy, true},
		"not implemented":  {codes.Unimplemented, ErrUnsupported, false},
		"not staged":       {codes.FailedPrecondition, ErrNotStaged, false},
		"unknown volume":   {codes.NotFound, ErrNotFound, false},
		"bad request":      {codes.InvalidArgument, ErrInvalid, false},
		"no token":         {codes.Unauthenticated, ErrRejected, false},
		"wrong identity":   {codes.PermissionDenied, ErrRejected, false},
		"driver down":      {codes.Unavailable, ErrUnreachable, true},
		"driver hung":      {codes.DeadlineExceeded, ErrTimeout, true},
		"driver exploded":  {codes.Internal, ErrCall, true},
		"resource limited": {codes.ResourceExhausted, ErrCall, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := &fakeSidecar{probeErr: status.Error(tc.code, "driver says "+name)}
			target, _ := serve(t, f)
			c := New(Options{})
			defer c.Close()
			_, err := c.Probe(context.Background(), target, "pvc-9")
			if !errors.Is(err, tc.want) {
				t.Fatalf("error = %v, want %v", err, tc.want)
			}
			if Retryable(err) != tc.retryable {
				t.Errorf("Retryable(%v) = %v, want %v", err, !tc.retryable, tc.retryable)
			}
			if status.Code(errors.Unwrap(err)) == codes.OK && !errors.Is(err, tc.want) {
				t.Error("the gRPC status is lost from the chain")
			}
			for _, w := range []string{"pvc-9", "node-a", "driver says"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestProbeTimeout(t *testing.T) {
	target, _ := serve(t, &fakeSidecar{hang: time.Minute})
	c := New(Options{ProbeTimeout: 100 * time.Millisecond})
	defer c.Close()
	start := time.Now()
	_, err := c.Probe(context.Background(), target, "pvc-1")
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("error = %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a hung sidecar held the call for %v", d)
	}
}

func TestMalformedResponse(t *testing.T) {
	target, _ := serve(t, &fakeSidecar{probe: &healerv1alpha1.NodeProbeVolumeResponse{
		HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_DEGRADED}},
	}})
	c := New(Options{})
	defer c.Close()
	if _, err := c.Probe(context.Background(), target, "pvc-1"); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a health entry without a reason: error = %v, want ErrMalformed", err)
	}
}

func TestCapabilitiesCachedUntilRefresh(t *testing.T) {
	f := &fakeSidecar{}
	target, _ := serve(t, f)
	c := New(Options{})
	defer c.Close()
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		caps, err := c.Capabilities(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		if !caps.Probe || !caps.Heal || caps.ListVolumes || caps.Attributes["healMounters"] != "rbd-nbd" {
			t.Fatalf("capabilities = %+v", caps)
		}
	}
	c.Refresh("rbd.csi.ceph.com", "node-a")
	if _, err := c.Capabilities(ctx, target); err != nil {
		t.Fatal(err)
	}
	if f.capsCalls != 2 {
		t.Errorf("capability calls = %d, want 2 (one, then one after the restart)", f.capsCalls)
	}

	wrong := target
	wrong.Driver = "cephfs.csi.ceph.com"
	if _, err := c.Capabilities(ctx, wrong); !errors.Is(err, ErrMalformed) {
		t.Errorf("a sidecar serving another driver: error = %v, want ErrMalformed", err)
	}
}

// A sidecar that does not answer its capabilities call costs one timeout, not one per volume:
// the failure is answered from memory for CapabilityFailureTTL, then asked again.
func TestCapabilityFailuresAreRememberedBriefly(t *testing.T) {
	f := &fakeSidecar{capsHang: 10 * time.Second}
	target, _ := serve(t, f)
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	c := New(Options{ProbeTimeout: 200 * time.Millisecond, CapabilityFailureTTL: 5 * time.Second, Clock: clk})
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Capabilities(ctx, target); !errors.Is(err, ErrTimeout) {
		t.Fatalf("first call: %v, want ErrTimeout", err)
	}
	start := time.Now()
	for range 50 {
		if _, err := c.Capabilities(ctx, target); !errors.Is(err, ErrTimeout) {
			t.Fatalf("a call within the failure TTL: %v, want the remembered ErrTimeout", err)
		}
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("50 calls within the failure TTL took %s; each waited for its own timeout", took)
	}
	f.mu.Lock()
	calls := f.capsCalls
	f.capsHang = 0
	f.mu.Unlock()
	if calls != 1 {
		t.Errorf("the sidecar saw %d capabilities calls, want 1", calls)
	}

	clk.SetTime(clk.Now().Add(6 * time.Second))
	if _, err := c.Capabilities(ctx, target); err != nil {
		t.Fatalf("after the failure TTL the sidecar answers: %v", err)
	}
	// A node plugin restart forgets a remembered failure at once.
	f.mu.Lock()
	f.capsHang = 10 * time.Second
	f.mu.Unlock()
	c.Refresh(target.Driver, target.Node)
	if _, err := c.Capabilities(ctx, target); !errors.Is(err, ErrTimeout) {
		t.Fatalf("hung again: %v, want ErrTimeout", err)
	}
	f.mu.Lock()
	f.capsHang = 0
	f.mu.Unlock()
	c.Refresh(target.Driver, target.Node)
	if _, err := c.Capabilities(ctx, target); err != nil {
		t.Errorf("after Refresh the failure was still remembered: %v", err)
	}
}

func TestListStagedFollowsPages(t *testing.T) {
	f := &fakeSidecar{pages: map[string]*healerv1alpha1.NodeListStagedVolumesResponse{
		"":     {Entries: []*healerv1alpha1.NodeListStagedVolumesResponse_Entry{{PvName: "pv-1", VolumeId: "v1"}}, NextToken: "t1"},
		"t1":   {Entries: []*healerv1alpha1.NodeListStagedVolumesResponse_Entry{{VolumeId: "v-unmapped"}, {PvName: "pv-3", VolumeId: "v3"}}},
		"loop": {NextToken: "loop"},
	}}
	target, _ := serve(t, f)
	c := New(Options{})
	defer c.Close()
	got, err := c.ListStaged(context.Background(), target)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].PV != "pv-1" || got[1].PV != "" || got[2].VolumeID != "v3" {
		t.Fatalf("staged = %+v", got)
	}
	f.pages[""] = &healerv1alpha1.NodeListStagedVolumesResponse{NextToken: "loop"}
	if _, err := c.ListStaged(context.Background(), target); !errors.Is(err, ErrMalformed) {
		t.Errorf("a repeating next token: error = %v, want ErrMalformed", err)
	}
}

// pagesOf answers ListStagedVolumes with pages of entries entries each, volume IDs of idBytes
// bytes, waiting wait before each page, and a next token after each page up to the last.
func pagesOf(pages, entries, idBytes int, wait time.Duration) func(context.Context, string) (*healerv1alpha1.NodeListStagedVolumesResponse, error) {
	id := strings.Repeat("v", idBytes)
	return func(ctx context.Context, token string) (*healerv1alpha1.NodeListStagedVolumesResponse, error) {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		n := 0
		if token != "" {
			n, _ = strconv.Atoi(token)
		}
		resp := &healerv1alpha1.NodeListStagedVolumesResponse{}
		for i := range entries {
			resp.Entries = append(resp.Entries, &healerv1alpha1.NodeListStagedVolumesResponse_Entry{VolumeId: fmt.Sprintf("%s-%d-%d", id, n, i)})
		}
		if n+1 < pages {
			resp.NextToken = strconv.Itoa(n + 1)
		}
		return resp, nil
	}
}

// TestListStagedBounds checks that a sidecar cannot make one listing of its node's staged volumes
// grow past the bounds on entries, bytes and time: the listing fails with an error that names the
// node and the bound, and a listing within the bounds is whole.
func TestListStagedBounds(t *testing.T) {
	tests := map[string]struct {
		opts Options
		list func(context.Context, string) (*healerv1alpha1.NodeListStagedVolumesResponse, error)
		// want is empty for a listing within the bounds, else what the error must say.
		want    []string
		wantErr error
		entries int
	}{
		"many pages within the bounds": {
			opts:    Options{ListMaxEntries: 1000, ListMaxBytes: 1 << 20, ListTimeout: 10 * time.Second},
			list:    pagesOf(20, 50, 10, 0),
			entries: 1000,
		},
		"endless pages: too many entries": {
			opts:    Options{ListMaxEntries: 1000, ListMaxBytes: 64 << 20, ListTimeout: time.Minute},
			list:    pagesOf(100, 50, 10, 0),
			want:    []string{"node node-a", "more than 1000 volumes", "stagedList.maxVolumes"},
			wantErr: ErrListTooLarge,
		},
		"huge pages: too many bytes": {
			opts:    Options{ListMaxEntries: 100000, ListMaxBytes: 1 << 20, ListTimeout: time.Minute},
			list:    pagesOf(16, 4, 64<<10, 0),
			want:    []string{"node node-a", "more than 1048576 bytes", "stagedList.maxBytes"},
			wantErr: ErrListTooLarge,
		},
		"slow pages: the whole listing's deadline": {
			opts:    Options{ListMaxEntries: 100000, ListMaxBytes: 64 << 20, ListTimeout: 500 * time.Millisecond, ProbeTimeout: 10 * time.Second},
			list:    pagesOf(20, 1, 10, 100*time.Millisecond),
			want:    []string{"node node-a", "500ms", "stagedList.timeout"},
			wantErr: ErrTimeout,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			target, _ := serve(t, &fakeSidecar{list: tc.list})
			c := New(tc.opts)
			defer c.Close()
			start := time.Now()
			got, err := c.ListStaged(context.Background(), target)
			if tc.want == nil {
				if err != nil || len(got) != tc.entries {
					t.Fatalf("ListStaged = %d volumes, %v; want %d volumes", len(got), err, tc.entries)
				}
				return
			}
			if err == nil {
				t.Fatalf("ListStaged = %d volumes and no error after %s; want the listing refused", len(got), time.Since(start).Round(time.Millisecond))
			}
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("error = %v; want %v", err, tc.wantErr)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error = %v; want it to say %q", err, w)
				}
			}
			if tc.opts.ListTimeout < time.Second && time.Since(start) > 3*tc.opts.ListTimeout {
				t.Errorf("the listing took %s; want it cut at about %s", time.Since(start), tc.opts.ListTimeout)
			}
		})
	}
}

func TestTargetFor(t *testing.T) {
	node := func(annotation, endpoint string) *csiaddonsv1alpha1.CSIAddonsNode {
		n := &csiaddonsv1alpha1.CSIAddonsNode{ObjectMeta: metav1.ObjectMeta{Namespace: "csi", Name: "n"}}
		if annotation != "" {
			n.Annotations = map[string]string{annotations.Endpoint: annotation}
		}
		n.Spec.Driver = csiaddonsv1alpha1.CSIAddonsNodeDriver{Name: "d", NodeID: "node-a", EndPoint: endpoint}
		return n
	}
	tests := map[string]struct {
		node    *csiaddonsv1alpha1.CSIAddonsNode
		want    string
		wantErr bool
	}{
		"healer annotation wins":  {node: node("10.0.0.5:9070", "pod://plugin.csi:9070"), want: "10.0.0.5:9070"},
		"IPv6 annotation":         {node: node("[fd00::5]:9070", ""), want: "[fd00::5]:9070"},
		"plain spec endpoint":     {node: node("", "10.0.0.6:9070"), want: "10.0.0.6:9070"},
		"csi-addons pod URL only": {node: node("", "pod://plugin.csi:9070"), wantErr: true},
		"no endpoint at all":      {node: node("", ""), wantErr: true},
		"the csi-addons sidecar's own address": {node: func() *csiaddonsv1alpha1.CSIAddonsNode {
			n := node("", "10.0.0.7:9070")
			n.Annotations = map[string]string{annotations.CSIAddonsPod: "uid-1"}
			return n
		}(), wantErr: true},
		"annotation written by 0.1.0 on the csi-addons sidecar's object": {node: func() *csiaddonsv1alpha1.CSIAddonsNode {
			n := node("", "10.0.0.7:9070")
			n.Annotations = map[string]string{annotations.CSIAddonsPod: "uid-1", annotations.Previous(annotations.Endpoint): "10.0.0.8:9070"}
			return n
		}(), want: "10.0.0.8:9070"},
		"the new annotation wins over the one of 0.1.0": {node: func() *csiaddonsv1alpha1.CSIAddonsNode {
			n := node("10.0.0.9:9070", "")
			n.Annotations[annotations.Previous(annotations.Endpoint)] = "10.0.0.8:9070"
			return n
		}(), want: "10.0.0.9:9070"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := TargetFor(tc.node)
			if tc.wantErr {
				if !errors.Is(err, ErrNoEndpoint) || !strings.Contains(err.Error(), "csi/n") {
					t.Fatalf("error = %v, want ErrNoEndpoint naming csi/n", err)
				}
				return
			}
			if err != nil || got.Endpoint != tc.want || got.Node != "node-a" {
				t.Fatalf("target = %+v, %v; want endpoint %s", got, err, tc.want)
			}
		})
	}
}

// guard is a Guard as the controller's leader election Lease is one: it lets calls run only until
// a time, and counts them in and out.
type guard struct {
	mu       sync.Mutex
	left     time.Duration
	refuse   error
	started  int
	returned int
}

func (g *guard) guard(ctx context.Context) (context.Context, func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.refuse != nil {
		return nil, nil, g.refuse
	}
	g.started++
	ctx, cancel := context.WithTimeout(ctx, g.left)
	return ctx, func() {
		cancel()
		g.mu.Lock()
		g.returned++
		g.mu.Unlock()
	}, nil
}

// A Guard that ends calls sooner than their timeout cuts them at its time: the sidecar gets that
// deadline with the call. Every call it let start is counted out when it returns.
func TestGuardBoundsEveryCall(t *testing.T) {
	f := &fakeSidecar{hang: time.Minute, probe: &healerv1alpha1.NodeProbeVolumeResponse{}, pages: map[string]*healerv1alpha1.NodeListStagedVolumesResponse{"": {}}}
	target, _ := serve(t, f)
	g := &guard{left: 300 * time.Millisecond}
	c := New(Options{ProbeTimeout: time.Minute, HealTimeout: time.Minute, Guard: g.guard})
	defer c.Close()
	ctx := context.Background()

	start := time.Now()
	if _, err := c.Probe(ctx, target, "pvc-1"); !errors.Is(err, ErrTimeout) {
		t.Fatalf("a probe of a hung volume: %v, want ErrTimeout at the Guard's time", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the probe took %s; the Guard gave it 300ms", took)
	}
	if _, err := c.Capabilities(ctx, target); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListStaged(ctx, target); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Heal(ctx, target, "pvc-1"); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("heal: %v, want ErrUnsupported from the fake sidecar", err)
	}
	f.mu.Lock()
	deadlines := append([]time.Duration(nil), f.deadlines...)
	f.mu.Unlock()
	if len(deadlines) != 3 {
		t.Fatalf("the sidecar saw %d calls with a handler, want 3", len(deadlines))
	}
	for i, d := range deadlines {
		if d <= 0 || d > 300*time.Millisecond {
			t.Errorf("call %d reached the sidecar with %s left, want at most the Guard's 300ms", i, d)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started != 4 || g.returned != 4 {
		t.Errorf("the Guard let %d calls start and saw %d return, want 4 and 4", g.started, g.returned)
	}
}

// A call the Guard refuses is not made, and a refused capabilities call is not remembered as the
// sidecar's failure.
func TestGuardRefusesCalls(t *testing.T) {
	f := &fakeSidecar{probe: &healerv1alpha1.NodeProbeVolumeResponse{}}
	target, _ := serve(t, f)
	g := &guard{left: time.Minute, refuse: errors.New("not the leader")}
	c := New(Options{Guard: g.guard})
	defer c.Close()
	ctx := context.Background()
	calls := map[string]func() error{
		"probe":        func() error { _, err := c.Probe(ctx, target, "pvc-1"); return err },
		"heal":         func() error { _, err := c.Heal(ctx, target, "pvc-1"); return err },
		"capabilities": func() error { _, err := c.Capabilities(ctx, target); return err },
		"list":         func() error { _, err := c.ListStaged(ctx, target); return err },
	}
	for name, call := range calls {
		err := call()
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "not the leader") || !strings.Contains(err.Error(), "node-a") {
			t.Errorf("%s: %v, want ErrRefused with the Guard's reason and the node", name, err)
		}
		if !Retryable(err) {
			t.Errorf("%s: a refused call is not retryable", name)
		}
	}
	f.mu.Lock()
	seen := len(f.deadlines) + f.capsCalls
	f.mu.Unlock()
	if seen != 0 {
		t.Errorf("the sidecar saw %d calls the Guard refused", seen)
	}

	g.mu.Lock()
	g.refuse = nil
	g.mu.Unlock()
	if _, err := c.Capabilities(ctx, target); err != nil {
		t.Errorf("capabilities once the Guard lets calls start: %v; the refusal was remembered", err)
	}
}

// nodeTokenSource gives "tok-<node>" and counts the requests per node.
type nodeTokenSource struct {
	mu    sync.Mutex
	asked map[string]int
}

func (s *nodeTokenSource) Token(_ context.Context, node string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked[node]++
	if node == "node-broken" {
		return "", errors.New("the API server refused the TokenRequest")
	}
	return "tok-" + node, nil
}

// TestEveryCallCarriesItsNodesToken sends each call with the token of the node it goes to, for
// every kind of call, and fails the call with the token source's reason when there is no token.
func TestEveryCallCarriesItsNodesToken(t *testing.T) {
	f := &fakeSidecar{probe: &healerv1alpha1.NodeProbeVolumeResponse{VolumeId: "v"}}
	a, _ := serve(t, f)
	b := a
	b.Node, b.Endpoint = "node-b", a.Endpoint
	src := &nodeTokenSource{asked: map[string]int{}}
	c := New(Options{Tokens: src, TokenFile: "/nonexistent/ignored"})
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Probe(ctx, a, "pv-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Capabilities(ctx, b); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListStaged(ctx, a); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	got := append([]string(nil), f.tokens...)
	f.mu.Unlock()
	want := []string{"Bearer tok-node-a", "Bearer tok-node-b", "Bearer tok-node-a"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("tokens seen = %v, want %v", got, want)
	}
	broken := a
	broken.Node = "node-broken"
	if _, err := c.Probe(ctx, broken, "pv-1"); err == nil || !strings.Contains(err.Error(), "refused the TokenRequest") {
		t.Errorf("a call without a token: %v, want the token source's reason", err)
	}
}

// restartSidecar answers RestartContainers with a scripted answer, error or hang.
type restartSidecar struct {
	fakeSidecar
	answer *healerv1alpha1.NodeRestartContainersResponse
	err    error
	hang   bool
	got    chan *healerv1alpha1.NodeRestartContainersRequest
}

func (f *restartSidecar) RestartContainers(ctx context.Context, req *healerv1alpha1.NodeRestartContainersRequest) (*healerv1alpha1.NodeRestartContainersResponse, error) {
	f.got <- req
	if f.hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return f.answer, f.err
}

func TestRestartContainers(t *testing.T) {
	tests := map[string]struct {
		answer  *healerv1alpha1.NodeRestartContainersResponse
		err     error
		hang    bool
		want    []string
		wantErr error
	}{
		"containers stopped": {
			answer: &healerv1alpha1.NodeRestartContainersResponse{Containers: []string{"app", "logger"}},
			want:   []string{"app", "logger"},
		},
		"no runtime access: never retried": {err: status.Error(codes.Unimplemented, "no CRI socket"), wantErr: ErrUnsupported},
		"pod does not use the volume here": {err: status.Error(codes.FailedPrecondition, "no container mounts it"), wantErr: ErrNotStaged},
		"runtime unreachable":              {err: status.Error(codes.Unavailable, "containerd down"), wantErr: ErrUnreachable},
		"garbage: no container named":      {answer: &healerv1alpha1.NodeRestartContainersResponse{}, wantErr: ErrMalformed},
		"garbage: an empty name":           {answer: &healerv1alpha1.NodeRestartContainersResponse{Containers: []string{"app", ""}}, wantErr: ErrMalformed},
		"hung sidecar":                     {hang: true, wantErr: ErrTimeout},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := &restartSidecar{answer: tc.answer, err: tc.err, hang: tc.hang, got: make(chan *healerv1alpha1.NodeRestartContainersRequest, 1)}
			target := serveRestart(t, f)
			c := New(Options{RestartTimeout: 200 * time.Millisecond})
			defer c.Close()
			start := time.Now()
			got, err := c.RestartContainers(context.Background(), target, "pv-1", "uid-1")
			req := <-f.got
			if req.GetPvName() != "pv-1" || req.GetPodUid() != "uid-1" {
				t.Errorf("sidecar got pv %q pod %q, want pv-1 uid-1", req.GetPvName(), req.GetPodUid())
			}
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("error = %v, want %v", err, tc.wantErr)
				}
				if !strings.Contains(err.Error(), "pv-1") || !strings.Contains(err.Error(), "uid-1") {
					t.Errorf("error %q names neither the volume nor the pod", err)
				}
				if tc.hang && time.Since(start) > 5*time.Second {
					t.Errorf("a hung sidecar held the call %s; want it cut at the 200ms timeout", time.Since(start))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("containers = %v, want %v", got, tc.want)
			}
		})
	}
}

func serveRestart(t *testing.T, f *restartSidecar) Target {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healerv1alpha1.RegisterNodeHealerServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return Target{Driver: "rbd.csi.ceph.com", Node: "node-a", Endpoint: ln.Addr().String()}
}

func TestCapabilitiesContainerRestart(t *testing.T) {
	f := &capsRestartSidecar{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healerv1alpha1.RegisterNodeHealerServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	c := New(Options{})
	defer c.Close()
	caps, err := c.Capabilities(context.Background(), Target{Driver: "rbd.csi.ceph.com", Node: "node-a", Endpoint: ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	if !caps.ContainerRestart {
		t.Error("ContainerRestart = false; the sidecar answered container_restart true")
	}
}

type capsRestartSidecar struct{ fakeSidecar }

func (f *capsRestartSidecar) GetHealerCapabilities(ctx context.Context, req *healerv1alpha1.NodeGetHealerCapabilitiesRequest) (*healerv1alpha1.NodeGetHealerCapabilitiesResponse, error) {
	resp, err := f.fakeSidecar.GetHealerCapabilities(ctx, req)
	if resp != nil {
		resp.ContainerRestart = true
	}
	return resp, err
}

// TestVolumeKeeping reads a sidecar's relayed volume keeping into the capabilities and a probe's
// kept into its result.
func TestVolumeKeeping(t *testing.T) {
	f := &keepingSidecar{fakeSidecar: fakeSidecar{probe: &healerv1alpha1.NodeProbeVolumeResponse{VolumeId: "vol-1", Healable: true, Kept: true}}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healerv1alpha1.RegisterNodeHealerServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	c := New(Options{})
	defer c.Close()
	target := Target{Driver: "rbd.csi.ceph.com", Node: "node-a", Endpoint: ln.Addr().String()}
	caps, err := c.Capabilities(context.Background(), target)
	if err != nil {
		t.Fatal(err)
	}
	if want := (VolumeKeeping{PluginRestart: true}); caps.VolumeKeeping != want || !caps.VolumeKeeping.Any() {
		t.Errorf("VolumeKeeping = %+v, want %+v", caps.VolumeKeeping, want)
	}
	if !caps.Probe || !caps.Heal {
		t.Errorf("capabilities %+v lost the RPCs beside the volume keeping", caps)
	}
	res, err := c.Probe(context.Background(), target, "pv-1")
	if err != nil {
		t.Fatal(err)
	}
	if !res.Kept || !res.Healthy() {
		t.Errorf("probe result %+v; want healthy and kept", res)
	}
}

type keepingSidecar struct{ fakeSidecar }

func (f *keepingSidecar) GetHealerCapabilities(ctx context.Context, req *healerv1alpha1.NodeGetHealerCapabilitiesRequest) (*healerv1alpha1.NodeGetHealerCapabilitiesResponse, error) {
	resp, err := f.fakeSidecar.GetHealerCapabilities(ctx, req)
	if resp != nil {
		resp.Capabilities = append(resp.Capabilities,
			healerv1alpha1.NewVolumeKeepingCapability(healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART),
			healerv1alpha1.NewVolumeKeepingCapability(healerv1alpha1.HealerCapability_VolumeKeeping_UNKNOWN))
	}
	return resp, err
}

// A sidecar that was down long enough for the connection to it to fail waits out gRPC's
// reconnection backoff (about a second after the first failure, doubling towards two minutes):
// calls fail fast meanwhile, although the sidecar is back. Redial, which the controller calls
// when the sidecar's restart marker announces its start, reaches it at once.
func TestRedialReachesARestartedSidecarAtOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := ln.Addr().String()
	_ = ln.Close()
	target := Target{Driver: "rbd.csi.ceph.com", Node: "node-a", Endpoint: endpoint}
	c := New(Options{ProbeTimeout: 5 * time.Second})
	defer c.Close()
	ctx := t.Context()
	if _, err := c.Probe(ctx, target, "pvc-1"); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("a probe of a sidecar that is down: %v, want ErrUnreachable", err)
	}

	ln, err = net.Listen("tcp", endpoint)
	if err != nil {
		t.Skipf("the port of the stopped sidecar was taken meanwhile: %v", err)
	}
	f := &fakeSidecar{probe: &healerv1alpha1.NodeProbeVolumeResponse{VolumeId: "0001-abc"}}
	srv := grpc.NewServer()
	healerv1alpha1.RegisterNodeHealerServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	// Without Redial, the connection is still waiting out its backoff (0.8s at least).
	if _, err := c.Probe(ctx, target, "pvc-1"); err == nil {
		t.Fatal("a probe right after the sidecar came back went through before the backoff ended; the test shows nothing")
	}
	start := time.Now()
	c.Redial(endpoint)
	var last error
	for time.Since(start) < 500*time.Millisecond {
		if _, last = c.Probe(ctx, target, "pvc-1"); last == nil {
			t.Logf("reached the restarted sidecar %s after Redial", time.Since(start).Round(time.Millisecond))
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("500ms after Redial the restarted sidecar is still not reached: %v", last)
}
