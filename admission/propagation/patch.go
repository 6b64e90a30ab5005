package propagation

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/volume-healer/volume-healer/policy"
)

// Container kinds, as the policy input names them.
const (
	kindContainer          = "container"
	kindInitContainer      = "initContainer"
	kindEphemeralContainer = "ephemeralContainer"
)

// PatchOperation is one operation of a JSONPatch (RFC 6902).
type PatchOperation struct {
	// Op is "add" where the mount has no mountPropagation, "replace" where it says None.
	Op string `json:"op"`
	// Path points at the mount's mountPropagation, such as
	// /spec/initContainers/0/volumeMounts/1/mountPropagation.
	Path string `json:"path"`
	// Value is always HostToContainer.
	Value corev1.MountPropagationMode `json:"value"`
}

// mount is one volumeMount of one of the pod's containers.
type mount struct {
	kind, container, path string
	propagation           *corev1.MountPropagationMode
}

// mountsByVolume lists the mounts of every container of the pod (init, regular and ephemeral),
// by volume name, in the pod's order.
func mountsByVolume(spec *corev1.PodSpec) map[string][]mount {
	out := map[string][]mount{}
	add := func(kind, name string, mounts []corev1.VolumeMount) {
		for _, m := range mounts {
			out[m.Name] = append(out[m.Name], mount{kind: kind, container: name, path: m.MountPath, propagation: m.MountPropagation})
		}
	}
	for _, c := range spec.InitContainers {
		add(kindInitContainer, c.Name, c.VolumeMounts)
	}
	for _, c := range spec.Containers {
		add(kindContainer, c.Name, c.VolumeMounts)
	}
	for _, c := range spec.EphemeralContainers {
		add(kindEphemeralContainer, c.Name, c.VolumeMounts)
	}
	return out
}

// changeable reports whether the webhook may set HostToContainer on a mount of propagation p:
// only where it is unset or None. HostToContainer needs no change; Bidirectional is never
// downgraded.
func changeable(p *corev1.MountPropagationMode) bool {
	return p == nil || *p == corev1.MountPropagationNone
}

// Patch returns the JSONPatch that sets mountPropagation HostToContainer on every mount, in any
// container of the pod, of the volumes named in set, where the mount's propagation is unset or
// None; nothing else. It is empty when nothing changes.
func Patch(spec *corev1.PodSpec, set map[string]bool) []PatchOperation {
	if len(set) == 0 {
		return nil
	}
	var ops []PatchOperation
	// Containers in the pod's order, so that the patch reads as the pod does.
	for _, field := range []struct {
		name       string
		containers int
		mounts     func(i int) []corev1.VolumeMount
	}{
		{"initContainers", len(spec.InitContainers), func(i int) []corev1.VolumeMount { return spec.InitContainers[i].VolumeMounts }},
		{"containers", len(spec.Containers), func(i int) []corev1.VolumeMount { return spec.Containers[i].VolumeMounts }},
		{"ephemeralContainers", len(spec.EphemeralContainers), func(i int) []corev1.VolumeMount { return spec.EphemeralContainers[i].VolumeMounts }},
	} {
		for i := range field.containers {
			for j, vm := range field.mounts(i) {
				if !set[vm.Name] || !changeable(vm.MountPropagation) {
					continue
				}
				op := "add"
				if vm.MountPropagation != nil {
					op = "replace"
				}
				ops = append(ops, PatchOperation{Op: op, Path: fmt.Sprintf("/spec/%s/%d/volumeMounts/%d/mountPropagation", field.name, i, j),
					Value: corev1.MountPropagationHostToContainer})
			}
		}
	}
	return ops
}

// claimVolumes lists the pod's volumes that name a PersistentVolumeClaim, with their mounts, as
// the policy input's volumes before the claims are looked up.
func claimVolumes(spec *corev1.PodSpec) []policy.ClaimVolume {
	mounts := mountsByVolume(spec)
	var out []policy.ClaimVolume
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		cv := policy.ClaimVolume{Name: v.Name, Claim: v.PersistentVolumeClaim.ClaimName, Mounts: []policy.VolumeMountInfo{}}
		for _, m := range mounts[v.Name] {
			p := ""
			if m.propagation != nil {
				p = string(*m.propagation)
			}
			cv.Mounts = append(cv.Mounts, policy.VolumeMountInfo{Container: m.container, ContainerKind: m.kind, MountPath: m.path, Propagation: p})
		}
		out = append(out, cv)
	}
	return out
}
