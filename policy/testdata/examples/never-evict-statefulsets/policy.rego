# Never restart the pods of a StatefulSet: they may hold a quorum that one lost member at a time
# already strains, so their operator restarts them. Other pods follow the built-in policy (opt-in
# by StorageClass or namespace label, controller-owned pods only).
package volumehealer

decision := data.volumehealer.builtin.decision

restart := {"action": "leave", "reason": "StatefulSetLeftAlone"} if {
	input.pod.ownerKind == "StatefulSet"
} else := data.volumehealer.builtin.restart
