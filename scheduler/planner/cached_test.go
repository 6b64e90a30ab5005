package planner

import (
	"fmt"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-healer/volume-healer/api/annotations"
)

// The API objects built from the records must carry every field the policy input and the
// guards read, unchanged.
func TestCacheTransformKeepsWhatIsRead(t *testing.T) {
	now := metav1.Now()
	pvName := "pvc-1"
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName, ResourceVersion: "7", DeletionTimestamp: &now,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}, Annotations: map[string]string{"big": "dropped"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: "rbd.csi.ceph.com", VolumeHandle: "0001-0009-rook-ceph-0000000000000002-8d7c3a6e-9f41-4b62-8a1d-2c5e8f0b7d34",
				FSType: "ext4", VolumeAttributes: map[string]string{"pool": "replicapool", "mounter": "rbd-nbd", "imageName": "csi-vol-8d7c3a6e-9f41-4b62-8a1d-2c5e8f0b7d34"},
				ReadOnly: true, NodeStageSecretRef: &corev1.SecretReference{Namespace: "rook-ceph", Name: "rook-csi-rbd-node"},
			}},
			VolumeMode:       ptr(corev1.PersistentVolumeFilesystem),
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			ClaimRef:         &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "shop", Name: "db", UID: "u1"},
			StorageClassName: "gold", MountOptions: []string{"discard"},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
	rec, err := CacheTransform(pv.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	got := PersistentVolumeFrom(rec)
	want := pv.DeepCopy()
	// What the sidecar's calls carry (fsType, volumeMode, readOnly, the node-stage Secret's
	// reference) is kept too.
	want.ManagedFields, want.Annotations, want.Spec.Capacity = nil, nil, nil
	want.DeletionTimestamp = got.DeletionTimestamp // only whether it is set is kept
	if got.DeletionTimestamp == nil || !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("PV after the cache:\n got %+v\nwant %+v", got, want)
	}

	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db", UID: "u1", ResourceVersion: "3",
			Labels: map[string]string{"app": "db"}, Annotations: map[string]string{annotations.SweepRequest: "r1"}},
		Spec:   corev1.PersistentVolumeClaimSpec{VolumeName: pvName, StorageClassName: ptr("gold")},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound},
	}
	rec, err = CacheTransform(pvc.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	gotClaim := ClaimFrom(rec)
	if gotClaim.Namespace != "shop" || gotClaim.Name != "db" || gotClaim.UID != "u1" || gotClaim.ResourceVersion != "3" ||
		gotClaim.Spec.VolumeName != pvName || gotClaim.Spec.StorageClassName == nil || *gotClaim.Spec.StorageClassName != "gold" ||
		!equality.Semantic.DeepEqual(gotClaim.Labels, pvc.Labels) ||
		!equality.Semantic.DeepEqual(gotClaim.Annotations, pvc.Annotations) || gotClaim.Kind != "PersistentVolumeClaim" {
		t.Errorf("PVC after the cache: %+v", gotClaim)
	}

	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "csi-1", ResourceVersion: "9"},
		Spec:       storagev1.VolumeAttachmentSpec{Attacher: "rbd.csi.ceph.com", NodeName: "n1", Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
		Status:     storagev1.VolumeAttachmentStatus{Attached: true, DetachError: &storagev1.VolumeError{Message: "busy"}},
	}
	rec, err = CacheTransform(va.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	gotVA := recordOf[cachedAttachment](rec).object()
	if gotVA.Name != "csi-1" || gotVA.Spec.Attacher != va.Spec.Attacher || gotVA.Spec.NodeName != "n1" ||
		*gotVA.Spec.Source.PersistentVolumeName != pvName || !gotVA.Status.Attached || gotVA.Status.DetachError == nil || gotVA.DeletionTimestamp != nil {
		t.Errorf("VolumeAttachment after the cache: %+v", gotVA)
	}

	node, err := CacheTransform(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "a"}},
		Status: corev1.NodeStatus{Images: []corev1.ContainerImage{{Names: []string{"big"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if n := node.(*corev1.Node); n.Name != "n1" || n.Labels["zone"] != "a" || len(n.Status.Images) != 0 {
		t.Errorf("Node after the cache: %+v", n)
	}
}

func ptr[T any](v T) *T { return &v }

// Interned strings are shared between records: the point of interning.
func TestCacheTransformSharesRepeatedStrings(t *testing.T) {
	mk := func(name string) *cachedPV {
		return compactPV(&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PersistentVolumeSpec{StorageClassName: string([]byte("gold")),
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
					Driver: string([]byte("rbd.csi.ceph.com")), VolumeAttributes: map[string]string{string([]byte("pool")): string([]byte("replicapool"))}}}}})
	}
	a, b := mk("a"), mk("b")
	same := func(x, y string) bool { return len(x) > 0 && unsafeData(x) == unsafeData(y) }
	if !same(a.storageClass, b.storageClass) || !same(a.driver, b.driver) || !same(a.attributes.shared.pairs[0].key, b.attributes.shared.pairs[0].key) || !same(a.attributes.shared.pairs[0].value, b.attributes.shared.pairs[0].value) {
		t.Error("repeated strings are not shared between records")
	}
}

func unsafeData(s string) *byte { return unsafe.StringData(s) }

// TestPVsOfAClassShareTheirShape checks that PVs alike but for their names, handles, attributes
// and claims share one pvShape, and that a PV whose phase differs does not share it.
func TestPVsOfAClassShareTheirShape(t *testing.T) {
	mk := func(name string, phase corev1.PersistentVolumePhase) *cachedPV {
		return compactPV(&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PersistentVolumeSpec{StorageClassName: "shape-gold", AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				MountOptions: []string{"discard"},
				ClaimRef:     &corev1.ObjectReference{Namespace: "shop", Name: "claim-" + name},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
					Driver: "rbd.csi.ceph.com", VolumeHandle: "h-" + name}}},
			Status: corev1.PersistentVolumeStatus{Phase: phase}})
	}
	a, b, c := mk("a", corev1.VolumeBound), mk("b", corev1.VolumeBound), mk("c", corev1.VolumeReleased)
	if a.pvShape != b.pvShape {
		t.Error("two bound PVs of one class do not share their shape")
	}
	if a.pvShape == c.pvShape || c.phase != corev1.VolumeReleased {
		t.Errorf("a released PV shares a bound one's shape (phase %s)", c.phase)
	}
	if b.object().Spec.ClaimRef.Name != "claim-b" || b.object().Spec.CSI.VolumeHandle != "h-b" || b.object().Spec.MountOptions[0] != "discard" {
		t.Errorf("record b builds %+v", b.object().Spec)
	}
}

func TestStringMap(t *testing.T) {
	// A value no other test uses: one seen before would be shared (TestRepeatedLongValuesAreShared).
	long := "csi-vol-5e0f1a2b-3c4d-4e5f-8a9b-teststringmap"
	a := newStringMap(map[string]string{"pool": "replicapool", "clusterID": "rook-ceph", "imageName": long})
	b := newStringMap(map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "imageName": long + "x"})
	if a.shared == nil || len(a.shared.pairs) != 2 || len(a.own) != 1 || a.shared != b.shared {
		t.Errorf("equal short pairs are not one shared slice: %+v, %+v", a, b)
	}
	if v, ok := a.get("imageName"); !ok || v != long {
		t.Errorf("get(imageName) = %q, %v", v, ok)
	}
	if v, ok := a.get("pool"); !ok || v != "replicapool" {
		t.Errorf("get(pool) = %q, %v", v, ok)
	}
	if _, ok := a.get("missing"); ok {
		t.Error("get(missing) found a value")
	}
	if m := a.toMap(); len(m) != 3 || m["clusterID"] != "rook-ceph" || m["imageName"] != long {
		t.Errorf("toMap = %v", m)
	}
	if m := newStringMap(nil).toMap(); m != nil {
		t.Errorf("empty map = %v, want nil", m)
	}
}

// A long value that every volume of a class has alike (a provisioner's identity) is shared like
// a short one once seen again; one unique to each volume (an image name) stays with its record.
func TestRepeatedLongValuesAreShared(t *testing.T) {
	identity := "1732870000000-8081-rbd.csi.ceph.com-repeated-long-value"
	mk := func(i int) stringMap {
		return newStringMap(map[string]string{
			"storage.kubernetes.io/csiProvisionerIdentity": string([]byte(identity)),
			"imageName": fmt.Sprintf("csi-vol-%08d-4a5b-11ef-9c1d-0a580a810212", i),
		})
	}
	mk(0)
	a, b := mk(1), mk(2)
	if a.shared == nil || a.shared != b.shared || len(a.own) != 1 || len(b.own) != 1 {
		t.Fatalf("records of two volumes: shared %+v and %+v, own %v and %v; want the identity shared, the image names their own", a.shared, b.shared, a.own, b.own)
	}
	if v, _ := b.get("imageName"); v != "csi-vol-00000002-4a5b-11ef-9c1d-0a580a810212" {
		t.Errorf("get(imageName) = %q", v)
	}
	if m := b.toMap(); len(m) != 2 || m["storage.kubernetes.io/csiProvisionerIdentity"] != identity {
		t.Errorf("toMap = %v", m)
	}
}

// A UID comes back as it was given, packed or not.
func TestPackedUID(t *testing.T) {
	for name, uid := range map[string]types.UID{
		"canonical":         "5f0c2a1e-3b4d-4c5e-8f9a-0b1c2d3e4f50",
		"uppercase":         "5F0C2A1E-3B4D-4C5E-8F9A-0B1C2D3E4F50",
		"zero":              "00000000-0000-0000-0000-000000000000",
		"not a UUID":        "claim-7",
		"hyphens elsewhere": "5f0c2a1e3-b4d-4c5e-8f9a-0b1c2d3e4f50",
		"empty":             "",
	} {
		p := packUID(uid)
		if got := p.uid(); got != uid {
			t.Errorf("%s: packUID(%q).uid() = %q", name, uid, got)
		}
		if !p.equal(packUID(types.UID(string([]byte(uid))))) {
			t.Errorf("%s: %q packed twice is not equal", name, uid)
		}
		if uid != "" && p.equal(packUID("5f0c2a1e-3b4d-4c5e-8f9a-0b1c2d3e4f51")) {
			t.Errorf("%s: %q equals another UID", name, uid)
		}
	}
	if p := packUID("5f0c2a1e-3b4d-4c5e-8f9a-0b1c2d3e4f50"); p.other != nil {
		t.Error("a canonical UUID is kept as a string")
	}
}

// Values that are short yet differ per volume must not grow the shared table without end.
func TestSharedPairsAreBounded(t *testing.T) {
	for i := range 2 * maxSharedSets {
		newStringMap(map[string]string{"id": fmt.Sprintf("v-%d", i)})
	}
	sharedPairs.mu.Lock()
	n := len(sharedPairs.sets)
	sharedPairs.mu.Unlock()
	if n > maxSharedSets {
		t.Errorf("shared table holds %d sets, bound %d", n, maxSharedSets)
	}
}
