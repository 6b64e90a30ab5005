# ceph-csi RBD with rbd-nbd.
#
# Use when: ceph-csi's RBD driver (rbd.csi.ceph.com) serves some StorageClasses with
# mounter: rbd-nbd. rbd-nbd runs inside the node plugin and dies with it, leaving dead mounts that
# the driver's healer service can heal in place; krbd (no mounter parameter, or mounter: krbd)
# is a kernel mount that survives a restart of the node plugin, so its volumes are neither probed
# nor healed. Volumes of other drivers follow the built-in policy.
#
# Install: kubectl -n <controller namespace> create configmap volume-healer-policy \
#   --from-file=policy.rego && kubectl -n <controller namespace> label configmap \
#   volume-healer-policy volume-healer.io/policy=rego (or the chart's policy.rego value).
package volumehealer

rbd_driver := "rbd.csi.ceph.com"

decision := {"action": "skip", "reason": "KernelMounter"} if {
	input.volume.driver == rbd_driver
	object.get(input.volume.attributes, "mounter", "krbd") != "rbd-nbd"
} else := data.volumehealer.builtin.decision

# Pods that still see a healed volume's dead mount restart as the built-in policy says: in place
# where the sidecar may, otherwise evicted where the StorageClass or namespace opted in.
restart := data.volumehealer.builtin.restart

propagation := data.volumehealer.builtin.propagation
