package healer

import (
	"context"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler"
)

// recheckingSidecars answers every probe on one node with a "check again in an hour" hint, as a
// driver does for a volume it just looked at.
type recheckingSidecars struct {
	*fakeSidecars
	node string
}

func (r recheckingSidecars) Probe(ctx context.Context, t probe.Target, pv string) (*probe.Result, error) {
	res, err := r.fakeSidecars.Probe(ctx, t, pv)
	if err == nil && t.Node == r.node {
		res.RecheckAfter = time.Hour
	}
	return res, err
}

// A volume used on two nodes (RWX) has a life on each: a "check again later" answered on node B
// says nothing of its mount on node A, whose periodic sweep still probes it.
func TestRecheckOnOneNodeDoesNotHideTheVolumeOnAnother(t *testing.T) {
	f := newFixture(t, 0, false)
	nodeB := &csiaddonsv1alpha1.CSIAddonsNode{
		ObjectMeta: metav1.ObjectMeta{Namespace: "csi", Name: "node-b-rbd", Annotations: map[string]string{
			annotations.HealerRestart: "start-1", annotations.Endpoint: "127.0.0.2:9070",
		}},
		Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{Name: "rbd", NodeID: "node-b"}},
	}
	f.targets.Set(nodeB)
	f.sweeper.opts.Sidecars = recheckingSidecars{fakeSidecars: f.sidecars, node: "node-b"}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "shared"},
		Spec: corev1.PersistentVolumeSpec{
			StorageClassName:       "gold",
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "rbd", VolumeHandle: "h-shared"}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
	attach := func(node string) {
		t.Helper()
		va := &storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: "va-shared-" + node},
			Spec:       storagev1.VolumeAttachmentSpec{Attacher: "rbd", NodeName: node, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv.Name}},
			Status:     storagev1.VolumeAttachmentStatus{Attached: true},
		}
		if err := f.caches.Add(va); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.caches.Add(pv); err != nil {
		t.Fatal(err)
	}
	periodic := scheduler.Sweep{Trigger: scheduler.TriggerSchedule, StorageClass: "gold", Fired: time.Now()}

	attach("node-b")
	if sum := f.sweeper.Run(context.Background(), periodic); sum.Probed != 1 {
		t.Fatalf("first sweep %+v, want the volume probed on node-b", sum)
	}
	attach("node-a")
	sum := f.sweeper.Run(context.Background(), periodic)
	probedOnA := 0
	f.sidecars.set(func(s *fakeSidecars) {
		for _, e := range s.endpoints {
			if e == "127.0.0.1:9070" {
				probedOnA++
			}
		}
	})
	if probedOnA != 1 {
		t.Errorf("the volume was probed %d times on node-a (summary %+v); node-b's recheck hint kept node-a's sweep from probing it", probedOnA, sum)
	}
}
