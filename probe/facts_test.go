package probe

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// factsSidecar records the requests of probes and heals.
type factsSidecar struct {
	healerv1alpha1.UnimplementedNodeHealerServer
	mu     sync.Mutex
	probes []*healerv1alpha1.NodeProbeVolumeRequest
	heals  []*healerv1alpha1.NodeHealVolumeRequest
}

func (f *factsSidecar) ProbeVolume(_ context.Context, req *healerv1alpha1.NodeProbeVolumeRequest) (*healerv1alpha1.NodeProbeVolumeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.probes = append(f.probes, req)
	return &healerv1alpha1.NodeProbeVolumeResponse{VolumeId: req.GetVolume().GetVolumeHandle()}, nil
}

func (f *factsSidecar) HealVolume(_ context.Context, req *healerv1alpha1.NodeHealVolumeRequest) (*healerv1alpha1.NodeHealVolumeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.heals = append(f.heals, req)
	return &healerv1alpha1.NodeHealVolumeResponse{VolumeId: req.GetVolume().GetVolumeHandle()}, nil
}

// TestCallsCarryTheCachedFacts: probes and heals carry what the controller's caches hold of the
// PV, so that the sidecar reads nothing; a PV the caches do not hold, or no cache at all, sends
// the PV name alone, as older controllers did.
func TestCallsCarryTheCachedFacts(t *testing.T) {
	block := corev1.PersistentVolumeBlock
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-1"},
		Spec: corev1.PersistentVolumeSpec{
			AccessModes:  []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod, corev1.ReadWriteOnce},
			MountOptions: []string{"discard"},
			VolumeMode:   &block,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: "rbd.csi.ceph.com", VolumeHandle: "0001-vol", FSType: "xfs", ReadOnly: true,
				VolumeAttributes:   map[string]string{"pool": "replicapool"},
				NodeStageSecretRef: &corev1.SecretReference{Namespace: "rook-ceph", Name: "rook-csi-rbd-node"},
			}},
		},
	}
	want := &healerv1alpha1.VolumeFacts{
		DriverName: "rbd.csi.ceph.com", VolumeHandle: "0001-vol", VolumeContext: map[string]string{"pool": "replicapool"},
		AccessModes: []string{"ReadWriteOncePod", "ReadWriteOnce"}, VolumeMode: "Block", FsType: "xfs",
		MountOptions: []string{"discard"}, ReadOnly: true,
		NodeStageSecretRef: &healerv1alpha1.SecretReference{Namespace: "rook-ceph", Name: "rook-csi-rbd-node"},
	}
	caches := func(name string) (*corev1.PersistentVolume, bool) {
		if name == pv.Name {
			return pv, true
		}
		return nil, false
	}
	for name, tc := range map[string]struct {
		caches func(string) (*corev1.PersistentVolume, bool)
		pv     string
		want   *healerv1alpha1.VolumeFacts
	}{
		"a PV in the caches":         {caches: caches, pv: "pv-1", want: want},
		"a PV not in the caches":     {caches: caches, pv: "pv-2"},
		"a controller without cache": {pv: "pv-1"},
	} {
		t.Run(name, func(t *testing.T) {
			f := &factsSidecar{}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := grpc.NewServer()
			healerv1alpha1.RegisterNodeHealerServer(srv, f)
			go func() { _ = srv.Serve(ln) }()
			t.Cleanup(srv.Stop)
			c := New(Options{PersistentVolume: tc.caches})
			t.Cleanup(c.Close)
			target := Target{Driver: "rbd.csi.ceph.com", Node: "node-a", Endpoint: ln.Addr().String()}
			if _, err := c.Probe(t.Context(), target, tc.pv); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Heal(t.Context(), target, tc.pv); err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			for rpc, got := range map[string]*healerv1alpha1.VolumeFacts{"probe": f.probes[0].GetVolume(), "heal": f.heals[0].GetVolume()} {
				if !proto.Equal(got, tc.want) {
					t.Errorf("%s of %s carried facts %v, want %v", rpc, tc.pv, got, tc.want)
				}
			}
			if f.probes[0].GetPvName() != tc.pv || f.heals[0].GetPvName() != tc.pv {
				t.Errorf("calls named %q and %q, want %q", f.probes[0].GetPvName(), f.heals[0].GetPvName(), tc.pv)
			}
		})
	}
}
