package sidecar

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	authenticationv1 "k8s.io/api/authentication/v1"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
)

// allowedCodes are the codes docs/protocol.md lets NodeHealer answer with (auth is not in play here).
var allowedCodes = map[codes.Code]bool{
	codes.OK: true, codes.InvalidArgument: true, codes.NotFound: true, codes.FailedPrecondition: true,
	codes.Aborted: true, codes.Unimplemented: true, codes.Unavailable: true, codes.DeadlineExceeded: true,
	codes.Internal: true,
}

// FuzzNodeHealerRequests feeds arbitrary wire bytes, decoded as each NodeHealer request, to the
// sidecar's handlers in front of the reference driver: whatever arrives, the sidecar must not
// panic, must answer with a code of the protocol's tables, and must only relay volumes it resolved.
func FuzzNodeHealerRequests(f *testing.F) {
	for _, seed := range []struct {
		op  byte
		msg proto.Message
	}{
		{0, &healerv1alpha1.NodeProbeVolumeRequest{PvName: "pv-1"}},
		{0, &healerv1alpha1.NodeProbeVolumeRequest{PvName: "other-driver"}},
		{0, &healerv1alpha1.NodeProbeVolumeRequest{PvName: "../../etc/passwd"}},
		{1, &healerv1alpha1.NodeHealVolumeRequest{PvName: "pv-2"}},
		{1, &healerv1alpha1.NodeHealVolumeRequest{}},
		{2, &healerv1alpha1.NodeListStagedVolumesRequest{MaxEntries: 1}},
		{2, &healerv1alpha1.NodeListStagedVolumesRequest{MaxEntries: -5, StartingToken: "garbage"}},
		{3, &healerv1alpha1.NodeGetHealerCapabilitiesRequest{}},
	} {
		data, err := proto.Marshal(seed.msg)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(seed.op, data)
	}
	f.Add(byte(0), []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})

	h := fuzzHealer(f)
	f.Fuzz(func(t *testing.T, op byte, data []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		switch op % 4 {
		case 0:
			req := &healerv1alpha1.NodeProbeVolumeRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			var resp *healerv1alpha1.NodeProbeVolumeResponse
			resp, err = h.ProbeVolume(ctx, req)
			if err == nil && resp.GetVolumeId() != fuzzVolumes[req.GetPvName()] {
				t.Fatalf("probe of PV %q answered for volume %q", req.GetPvName(), resp.GetVolumeId())
			}
		case 1:
			req := &healerv1alpha1.NodeHealVolumeRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			var resp *healerv1alpha1.NodeHealVolumeResponse
			resp, err = h.HealVolume(ctx, req)
			if err == nil && resp.GetVolumeId() != fuzzVolumes[req.GetPvName()] {
				t.Fatalf("heal of PV %q answered for volume %q", req.GetPvName(), resp.GetVolumeId())
			}
		case 2:
			req := &healerv1alpha1.NodeListStagedVolumesRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = h.ListStagedVolumes(ctx, req)
		default:
			_, err = h.GetHealerCapabilities(ctx, &healerv1alpha1.NodeGetHealerCapabilitiesRequest{})
		}
		if code := status.Code(err); !allowedCodes[code] {
			t.Fatalf("answer %v has code %s, outside the protocol's error tables", err, code)
		}
	})
}

// fuzzVolumes maps the PVs of the fuzzed sidecar to their volume handles.
var fuzzVolumes = map[string]string{"pv-1": "vol-1", "pv-2": "vol-2", "pv-3": "vol-3"}

// fuzzHealer returns the sidecar's NodeHealer in front of a reference driver serving vol-1..vol-3,
// with PVs pv-1..pv-3 of that driver and one PV of another driver in its caches.
func fuzzHealer(f *testing.F) *nodeHealer {
	f.Helper()
	sockDir, err := os.MkdirTemp("", "vhfz")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	d, err := simulated.New(simulated.Options{StateDir: f.TempDir(), SeedVolumes: []string{"vol-1", "vol-2", "vol-3"}})
	if err != nil {
		f.Fatal(err)
	}
	endpoint := "unix://" + filepath.Join(sockDir, "d.sock")
	srv, err := simulated.NewServer(d, simulated.ServerOptions{Endpoint: endpoint})
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	f.Cleanup(func() { cancel(); <-done })

	objs := []any{testPV("other-driver", "someone.else", "vol-1")}
	for pv, handle := range fuzzVolumes {
		objs = append(objs, testPV(pv, d.Name(), handle))
	}
	vols := startVolumesFor(f, objs...)
	dc, err := newDriverClient(&Options{DriverEndpoint: endpoint, DriverTimeout: 2 * time.Second, MaxMessageSize: DefaultMaxMessageSize}, NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = dc.close() })
	h := &nodeHealer{nodeName: "node-1", driver: dc, volumes: vols}
	// The fuzzing means little unless well-formed requests get through to the driver.
	resp, err := h.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: "pv-1"})
	if err != nil || resp.GetVolumeId() != "vol-1" {
		f.Fatalf("probe of pv-1 through the fuzzed sidecar: %v, %v", resp, err)
	}
	return h
}

// FuzzAuthorization sends arbitrary "authorization" metadata, one value or two, through the
// sidecar's authentication, which runs before any other work: it never panics, answers every
// refusal Unauthenticated, PermissionDenied or Unavailable, and lets a call through only with
// exactly one "Bearer <token>" value whose token the TokenReview accepted for an allowed identity.
func FuzzAuthorization(f *testing.F) {
	for _, seed := range []struct{ first, second string }{
		{"Bearer good-token", ""}, {"bearer good-token", ""}, {"Bearer   good-token  ", ""},
		{"Bearer other-user-token", ""}, {"Bearer bad", ""}, {"Bearer", ""}, {"Basic Zm9vOmJhcg==", ""},
		{"", ""}, {"Bearer good-token", "Bearer good-token"}, {"Bearer \x00", ""}, {" Bearer good-token", ""},
	} {
		f.Add(seed.first, seed.second)
	}
	reviewer := &fakeReviewer{users: map[string]authenticationv1.UserInfo{
		"good-token":       {Username: DefaultAllowedIdentity},
		"other-user-token": {Username: "system:serviceaccount:default:intruder"},
	}}
	f.Fuzz(func(t *testing.T, first, second string) {
		a, _, _ := newTestAuthenticator(t, reviewer, nil)
		values := []string{first}
		if second != "" {
			values = append(values, second)
		}
		_, err := a.authenticate(withAuth(values...))
		reached := err == nil
		scheme, token, _ := strings.Cut(strings.TrimSpace(first), " ")
		wantThrough := len(values) == 1 && strings.EqualFold(scheme, "Bearer") && strings.TrimSpace(token) == "good-token"
		if reached != wantThrough {
			t.Fatalf("authorization %q: reached the handler %v, want %v (err %v)", values, reached, wantThrough, err)
		}
		if err != nil {
			switch status.Code(err) {
			case codes.Unauthenticated, codes.PermissionDenied, codes.Unavailable:
			default:
				t.Fatalf("authorization %q: refused with %v, want Unauthenticated, PermissionDenied or Unavailable", values, err)
			}
		}
	})
}
