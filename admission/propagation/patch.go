package propagation

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
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
