package policy

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestClaimVolumesOf: only volumes that name a claim are listed, each with its mounts in every
// kind of container.
func TestClaimVolumesOf(t *testing.T) {
	bidirectional := corev1.MountPropagationBidirectional
	spec := corev1.PodSpec{
		Volumes: []corev1.Volume{
			{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}},
			{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-web-0"}}},
			{Name: "unused", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "spare"}}},
		},
		InitContainers: []corev1.Container{{Name: "restore", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
		Containers: []corev1.Container{{Name: "app", VolumeMounts: []corev1.VolumeMount{
			{Name: "config", MountPath: "/etc"}, {Name: "data", MountPath: "/data", MountPropagation: &bidirectional}}}},
		EphemeralContainers: []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug",
			VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/mnt"}}}}},
	}
	want := []ClaimVolume{
		{Name: "data", Claim: "data-web-0", Mounts: []VolumeMountInfo{
			{Container: "restore", ContainerKind: "initContainer", MountPath: "/data"},
			{Container: "app", ContainerKind: "container", MountPath: "/data", Propagation: "Bidirectional"},
			{Container: "debug", ContainerKind: "ephemeralContainer", MountPath: "/mnt"},
		}},
		{Name: "unused", Claim: "spare", Mounts: []VolumeMountInfo{}},
	}
	if got := ClaimVolumesOf(&spec); !reflect.DeepEqual(got, want) {
		t.Errorf("claim volumes = %+v, want %+v", got, want)
	}
}
