# ceph-csi CephFS with ceph-fuse.
#
# Use when: ceph-csi's CephFS driver (cephfs.csi.ceph.com) serves some StorageClasses with
# mounter: fuse. ceph-fuse runs inside the node plugin and dies with it; the kernel client (no
# mounter parameter, or mounter: kernel) survives a restart, so its volumes are left alone. CephFS
# has no attach step (no VolumeAttachment): a volume is probed on the nodes that stage it.
# ceph-fuse volumes are shared (ReadWriteMany) by pods of several nodes, so a heal on one node
# asks only that node's pods to restart; they are evicted only where the StorageClass or the
# namespace opted in. Volumes of other drivers follow the built-in policy.
#
# Install: as a policy ConfigMap (label volume-healer.io/policy=rego) in the controller's
# namespace, or as the chart's policy.rego value.
package volumehealer

cephfs_driver := "cephfs.csi.ceph.com"

decision := {"action": "skip", "reason": "KernelMounter"} if {
	input.volume.driver == cephfs_driver
	object.get(input.volume.attributes, "mounter", "kernel") != "fuse"
} else := data.volumehealer.builtin.decision

restart := data.volumehealer.builtin.restart

propagation := data.volumehealer.builtin.propagation
