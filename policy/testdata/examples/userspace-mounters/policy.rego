# Heal only volumes mounted by a userspace mounter. rbd-nbd and ceph-fuse run inside the node
# plugin and die with it; kernel mounts (krbd, the CephFS kernel client) survive a restart, so
# there is nothing to probe or heal. Volumes of userspace mounters follow the built-in policy.
package volumehealer

userspace_mounters := {"rbd-nbd", "fuse"}

decision := data.volumehealer.builtin.decision if {
	input.volume.attributes.mounter in userspace_mounters
} else := {"action": "skip", "reason": "KernelMounter"}
