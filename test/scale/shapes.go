package scale

import (
	"errors"
	"fmt"
	"hash/fnv"
	"maps"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/test/fixtures"
)

// shapes builds the harness's objects from the project's fixtures, so that they have the shape
// and size of what Ceph CSI, the external-provisioner and the external-attacher create.
type shapes struct {
	driver         *storagev1.CSIDriver
	storageClasses []*storagev1.StorageClass
	// userspace and kernel are the StorageClass names of rbd-nbd volumes (which a node plugin
	// restart breaks) and krbd ones.
	userspace, kernel string
	// pvTemplates are PersistentVolumes of each StorageClass.
	pvTemplates map[string]*corev1.PersistentVolume
}

func newShapes() (*shapes, error) {
	set, err := fixtures.Drivers()
	if err != nil {
		return nil, err
	}
	s := &shapes{pvTemplates: map[string]*corev1.PersistentVolume{}}
	for _, d := range set.CSIDrivers {
		if d.Name == driverName {
			s.driver = d
		}
	}
	for _, sc := range set.StorageClasses {
		if sc.Provisioner != driverName {
			continue
		}
		s.storageClasses = append(s.storageClasses, sc)
		if sc.Parameters["mounter"] == "rbd-nbd" {
			s.userspace = sc.Name
		} else {
			s.kernel = sc.Name
		}
	}
	for _, pv := range set.PVs {
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == driverName {
			s.pvTemplates[pv.Spec.StorageClassName] = pv
		}
	}
	if s.driver == nil || s.userspace == "" || s.kernel == "" || s.pvTemplates[s.userspace] == nil || s.pvTemplates[s.kernel] == nil {
		return nil, errors.New("fixtures: want the Ceph RBD CSIDriver, an rbd-nbd and a krbd StorageClass, and a PersistentVolume of each")
	}
	return s, nil
}

func appNamespace(i int) string { return fmt.Sprintf("app-%02d", i) }

// volume is one simulated volume: a bound PV and PVC and an attached VolumeAttachment.
type volume struct {
	pv, pvc, namespace, handle, class, node string
}

// va is the VolumeAttachment name the attach/detach controller gives it: "csi-" and the SHA-256
// of volume handle, attacher and node.
func (v volume) va() string {
	return healerv1alpha1.VolumeAttachmentName(v.handle, driverName, v.node)
}

// uuid derives a stable UUID-shaped string, so that names have the length of real ones.
func uuid(node string, i int) string {
	h := fnv.New64a()
	_, _ = fmt.Fprintf(h, "%s/%d", node, i)
	a := h.Sum64()
	_, _ = h.Write([]byte{0})
	b := h.Sum64()
	return fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", uint32(a>>32), uint16(a>>16), uint16(a)&0xfff, uint16(b>>48)&0xfff, b&0xffffffffffff)
}

// newVolumes names n volumes on node: three in four use rbd-nbd, the userspace mounter that a
// node plugin restart kills, the others krbd; the claims spread over the application namespaces.
func (s *shapes) newVolumes(node string, n int) []volume {
	out := make([]volume, n)
	for i := range out {
		id := uuid(node, i)
		class := s.userspace
		if i%4 == 3 {
			class = s.kernel
		}
		out[i] = volume{
			pv:        "pvc-" + id,
			pvc:       fmt.Sprintf("data-%s-%d", node, i),
			namespace: appNamespace(i % appNamespaces),
			handle:    "0001-0009-rook-ceph-0000000000000002-" + id,
			class:     class,
			node:      node,
		}
	}
	return out
}

// mounter is the volume's mounter as the driver knows it.
func (s *shapes) mounter(v volume) string {
	if m := s.pvTemplates[v.class].Spec.CSI.VolumeAttributes["mounter"]; m != "" {
		return m
	}
	return "krbd"
}

// objects returns the volume's PV, PVC and VolumeAttachment with the status that binding and
// attaching leave.
func (s *shapes) objects(v volume) (*corev1.PersistentVolume, *corev1.PersistentVolumeClaim, *storagev1.VolumeAttachment) {
	tmpl := s.pvTemplates[v.class]
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        v.pv,
			Labels:      map[string]string{nodeLabel: v.node},
			Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": driverName},
			Finalizers:  []string{"kubernetes.io/pv-protection", "external-attacher/rbd-csi-ceph-com"},
		},
		Spec:   *tmpl.Spec.DeepCopy(),
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
	pv.Spec.ClaimRef = &corev1.ObjectReference{APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: v.namespace, Name: v.pvc}
	pv.Spec.CSI.VolumeHandle = v.handle
	pv.Spec.CSI.VolumeAttributes = maps.Clone(tmpl.Spec.CSI.VolumeAttributes)
	pv.Spec.CSI.VolumeAttributes["imageName"] = "csi-vol-" + v.pv[len("pvc-"):]

	class := v.class
	size := pv.Spec.Capacity[corev1.ResourceStorage]
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: v.namespace, Name: v.pvc,
			Labels: map[string]string{"app.kubernetes.io/name": fmt.Sprintf("app-%d", len(v.pvc)%7)},
			Annotations: map[string]string{
				"pv.kubernetes.io/bind-completed":               "yes",
				"pv.kubernetes.io/bound-by-controller":          "yes",
				"volume.beta.kubernetes.io/storage-provisioner": driverName,
				"volume.kubernetes.io/storage-provisioner":      driverName,
			},
			Finalizers: []string{"kubernetes.io/pvc-protection"},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      pv.Spec.AccessModes,
			StorageClassName: &class,
			VolumeName:       v.pv,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size.DeepCopy()}},
		},
		Status: corev1.PersistentVolumeClaimStatus{
			Phase:       corev1.ClaimBound,
			AccessModes: pv.Spec.AccessModes,
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: size.DeepCopy()},
		},
	}

	pvName := v.pv
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: v.va(), Finalizers: []string{"external-attacher/rbd-csi-ceph-com"}},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: driverName, NodeName: v.node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
		Status: storagev1.VolumeAttachmentStatus{Attached: true},
	}
	return pv, pvc, va
}

// nodeObject is a Node as kubelet registers it, labels only.
func nodeObject(name string, i int) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"kubernetes.io/hostname":         name,
		"kubernetes.io/os":               "linux",
		"topology.kubernetes.io/zone":    fmt.Sprintf("zone-%d", i%3),
		"node-role.kubernetes.io/worker": "",
	}}}
}
