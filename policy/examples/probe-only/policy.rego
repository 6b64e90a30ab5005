# Probe only: report broken volumes, never touch workloads.
#
# Use when: trying volume-healer on a cluster for the first time, or where every repair must be
# done by a person. Volumes are probed as the built-in policy probes them (after node plugin
# restarts, on schedule, on request), and a broken one is reported through its PVC's Events,
# the volume_healer_volumes_unhealthy metric and healerctl status; nothing is healed or recycled,
# no pod is evicted or restarted, and no pod being created is changed (no propagation rule).
# Unlike config.dryRun it needs no restart of the controller to be lifted: replace the policy.
#
# Install: as a policy ConfigMap (label volume-healer.io/policy=rego) in the controller's
# namespace, or as the chart's policy.rego value.
package volumehealer

decision := {"action": "skip", "reason": "ProbeOnly"} if {
	is_boolean(input.probe.healthy)
	not input.probe.healthy
} else := {"action": "skip", "reason": "Healthy"} if {
	input.probe.healthy
} else := data.volumehealer.builtin.decision

restart := {"action": "leave", "reason": "ProbeOnly"}
