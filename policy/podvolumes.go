package policy

import corev1 "k8s.io/api/core/v1"

// Container kinds, as VolumeMountInfo.ContainerKind names them.
const (
	kindContainer          = "container"
	kindInitContainer      = "initContainer"
	kindEphemeralContainer = "ephemeralContainer"
)

// ClaimVolumesOf lists the pod's volumes that name a PersistentVolumeClaim, in the pod's order,
// each with its mounts in every container of the pod (init, regular and ephemeral, in the pod's
// order); what only the controller's caches know (PV, driver, StorageClass) is left empty.
func ClaimVolumesOf(spec *corev1.PodSpec) []ClaimVolume {
	mounts := map[string][]VolumeMountInfo{}
	add := func(kind, container string, vms []corev1.VolumeMount) {
		for _, m := range vms {
			p := ""
			if m.MountPropagation != nil {
				p = string(*m.MountPropagation)
			}
			mounts[m.Name] = append(mounts[m.Name], VolumeMountInfo{Container: container, ContainerKind: kind, MountPath: m.MountPath, Propagation: p})
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
	var out []ClaimVolume
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		out = append(out, ClaimVolume{Name: v.Name, Claim: v.PersistentVolumeClaim.ClaimName, Mounts: append([]VolumeMountInfo{}, mounts[v.Name]...)})
	}
	return out
}
