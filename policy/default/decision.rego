# The entry point the controller queries. A policy from ConfigMaps replaces this module and may
# still delegate to the built-in policy through data.volumehealer.builtin.decision and
# data.volumehealer.builtin.restart and data.volumehealer.builtin.propagation; a policy without a
# restart rule leaves every pod alone, one without a propagation rule changes no pod.
package volumehealer

decision := data.volumehealer.builtin.decision

restart := data.volumehealer.builtin.restart

propagation := data.volumehealer.builtin.propagation
