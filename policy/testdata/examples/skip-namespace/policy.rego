# Leave alone every volume of the namespace "scratch", and every volume whose claim carries the
# label volume-healer.io/skip: "true". Everything else follows the built-in policy.
package volumehealer

skipped_namespaces := {"scratch"}

decision := {"action": "skip", "reason": "NamespaceOptedOut"} if {
	input.volume.pvc.namespace in skipped_namespaces
} else := {"action": "skip", "reason": "ClaimOptedOut"} if {
	input.volume.pvc.labels["volume-healer.io/skip"] == "true"
} else := data.volumehealer.builtin.decision
