# A stock driver, recycled by eviction.
#
# Use when: a driver with userspace mounters runs as its vendor ships it, without the healer
# service (tier "none": the healer sidecar probes its volumes itself, node-locally), and its own
# NodeStageVolume and NodePublishVolume mount a volume again when kubelet asks. A dead, hung or
# read-only mount is then repaired by recycling: evicting the pods that use the volume on its node
# so that kubelet unstages it and the replacement pods get a fresh mount. This needs the
# controller's remediation (config.remediation.enabled, not dry-run): without it the volume is
# reported (Event, metrics) and left alone. The drivers listed in stock_drivers count as opted in:
# their pods are evicted without the volume-healer.io/evict-pods label, except bare pods (nothing
# would recreate them) and StatefulSet pods in a namespace labelled
# volume-healer.io/evict-statefulsets: "false".
#
# Install: as a policy ConfigMap (label volume-healer.io/policy=rego) in the controller's
# namespace, or as the chart's policy.rego value with remediation enabled.
package volumehealer

stock_drivers := {"rbd.csi.ceph.com", "cephfs.csi.ceph.com"}

stock if {
	input.volume.driver in stock_drivers
	input.driver.tier == "none"
}

# The built-in policy already recycles what a fresh mount repairs when evictions are on; without
# them it would report NotHealable: say what is missing instead.
decision := {"action": "skip", "reason": "RecycleNeedsEvictions"} if {
	stock
	not input.remedies.evict
	needs_recycling
	not data_loss
} else := data.volumehealer.builtin.decision

needs_recycling if data.volumehealer.builtin.recyclable

needs_recycling if input.probe.health[_].reason == "PublishTargetNotMounted"

data_loss if input.probe.health[_].status == "DATA_LOSS"

restart := data.volumehealer.builtin.restart if {
	not stock
} else := {"action": "leave", "reason": "NoController"} if {
	not input.pod.ownerKind in {"ReplicaSet", "StatefulSet", "DaemonSet", "Job"}
} else := {"action": "leave", "reason": "StatefulSetsNotEvicted"} if {
	input.pod.ownerKind == "StatefulSet"
	input.namespace.labels["volume-healer.io/evict-statefulsets"] == "false"
} else := {"action": "evict", "reason": "StockDriverRecycled"}

propagation := data.volumehealer.builtin.propagation
