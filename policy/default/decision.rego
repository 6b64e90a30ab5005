# The entry point the controller queries. A policy from ConfigMaps replaces this module and may
# still delegate to the built-in policy through data.volumehealer.builtin.decision.
package volumehealer

decision := data.volumehealer.builtin.decision
