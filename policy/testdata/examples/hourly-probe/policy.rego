# Volumes of the StorageClass ceph-rbd-nbd: on schedule, probe each at most once an hour however
# often the schedule fires, and never heal on schedule (a broken volume is reported, not healed);
# after a node plugin restart or on request, probe and heal as the built-in policy does.
#
# The policy reads the clock, so the engine evaluates it for every volume instead of memoizing
# decisions; that costs tens of microseconds per volume, not more.
package volumehealer

hourly_classes := {"ceph-rbd-nbd"}

hourly_schedule if {
	input.trigger == "schedule"
	input.volume.storageClass.name in hourly_classes
}

probed_within_the_hour if {
	time.now_ns() - time.parse_rfc3339_ns(input.history.lastProbe.time) < time.parse_duration_ns("1h")
}

decision := {"action": "skip", "reason": "ProbedWithinTheHour"} if {
	hourly_schedule
	not data.volumehealer.builtin.probed
	probed_within_the_hour
} else := {"action": "skip", "reason": "HealOnlyAfterRestart"} if {
	hourly_schedule
	data.volumehealer.builtin.decision.action == "heal"
} else := data.volumehealer.builtin.decision
