# A FUSE-based CSI driver (s3fs, goofys, rclone, JuiceFS, gcsfuse and the like).
#
# Use when: a driver mounts every volume through a FUSE daemon in its node plugin and serves the
# healer service (probe and heal). List its name in fuse_drivers. Its volumes are probed after
# every node plugin restart and on schedule, and healed in place when the driver says it can;
# a volume the driver cannot heal is recycled (its pods on the node evicted, so that the driver
# mounts it again) where evictions are on. Volumes of drivers not listed are never touched: the
# policy is an allow-list, for clusters that run the healer sidecar beside several drivers.
#
# Install: as a policy ConfigMap (label volume-healer.io/policy=rego) in the controller's
# namespace, or as the chart's policy.rego value.
package volumehealer

fuse_drivers := {"fuse.csi.example.com", "healer.example.com"}

decision := data.volumehealer.builtin.decision if {
	input.volume.driver in fuse_drivers
} else := {"action": "skip", "reason": "NotAFuseDriver"}

# A FUSE mount whose daemon died is gone for every pod that kept the old mount: restart them as
# the built-in policy says (in place where the sidecar may, else evict where opted in).
restart := data.volumehealer.builtin.restart if {
	input.volume.driver in fuse_drivers
} else := {"action": "leave", "reason": "NotAFuseDriver"}

propagation := data.volumehealer.builtin.propagation
