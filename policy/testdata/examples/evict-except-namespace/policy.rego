# Restart the pods that still see a healed volume's dead mount everywhere, without opting in,
# except in the namespace "payments", whose pods an operator restarts by hand. Bare pods are
# still left alone: nothing would recreate them. Volumes follow the built-in policy.
package volumehealer

decision := data.volumehealer.builtin.decision

restart := {"action": "leave", "reason": "NamespaceExcluded"} if {
	input.pod.namespace == "payments"
} else := {"action": "leave", "reason": "NoController"} if {
	input.pod.ownerKind == ""
} else := {"action": "evict", "reason": "EvictEverywhere"}
