# The entry point the controller queries. A policy from ConfigMaps replaces this module and may
# still delegate to the built-in policy through data.volumehealer.builtin.decision and
# data.volumehealer.builtin.restart; a policy without a restart rule leaves every pod alone.
package volumehealer

decision := data.volumehealer.builtin.decision

restart := data.volumehealer.builtin.restart
