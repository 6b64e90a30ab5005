package probe

import (
	corev1 "k8s.io/api/core/v1"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// volumeFacts returns what the controller's caches hold of PersistentVolume pv, for the sidecar's
// probe and heal requests, so that the sidecar need not read the PV (healerv1alpha1.VolumeFacts);
// nil when Options.PersistentVolume is not set or the PV is not a CSI volume in the caches, and
// the sidecar then reads it itself, as it did for older controllers.
func (c *Client) volumeFacts(pv string) *healerv1alpha1.VolumeFacts {
	if c.opts.PersistentVolume == nil {
		return nil
	}
	obj, ok := c.opts.PersistentVolume(pv)
	if !ok {
		return nil
	}
	return FactsOf(obj)
}

// FactsOf returns the facts of a PersistentVolume that the sidecar's probe and heal requests
// carry, or nil when it is not a CSI volume.
func FactsOf(pv *corev1.PersistentVolume) *healerv1alpha1.VolumeFacts {
	src := pv.Spec.CSI
	if src == nil {
		return nil
	}
	f := &healerv1alpha1.VolumeFacts{
		DriverName:    src.Driver,
		VolumeHandle:  src.VolumeHandle,
		VolumeContext: src.VolumeAttributes,
		FsType:        src.FSType,
		MountOptions:  pv.Spec.MountOptions,
		ReadOnly:      src.ReadOnly,
	}
	for _, m := range pv.Spec.AccessModes {
		f.AccessModes = append(f.AccessModes, string(m))
	}
	if pv.Spec.VolumeMode != nil {
		f.VolumeMode = string(*pv.Spec.VolumeMode)
	}
	if ref := src.NodeStageSecretRef; ref != nil {
		f.NodeStageSecretRef = &healerv1alpha1.SecretReference{Namespace: ref.Namespace, Name: ref.Name}
	}
	return f
}
