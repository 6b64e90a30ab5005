# Restart the pods only during the nightly maintenance window, 01:00 to 05:00 UTC; outside it,
# they are left alone and the next heal or probe that finds them on the dead mount asks again.
# Within the window, the built-in policy decides (opt-in, controller-owned pods only).
package volumehealer

decision := data.volumehealer.builtin.decision

restart := data.volumehealer.builtin.restart if {
	in_window
} else := {"action": "leave", "reason": "OutsideMaintenanceWindow"}

in_window if {
	[hour, _, _] := time.clock(time.parse_rfc3339_ns(input.time))
	hour >= 1
	hour < 5
}
