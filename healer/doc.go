// Package healer is the act stage of the pipeline. Its Sweeper runs one sweep from a trigger to
// the last heal, in three steps:
//
//   - plan (sweeper.go, Run and plan): the planner's volumes for the sweep, or for drivers
//     without VolumeAttachments the volumes the node's sidecar lists as staged;
//   - submit: node by node, several nodes at once, the driver's capabilities, then per volume
//     the policy's decision and a dispatch.Task that probes, asks the policy again with the probe
//     result, heals and probes once more; a node's tasks go to the dispatcher as soon as they are
//     decided, so that a node whose sidecar does not answer holds up only its own volumes;
//   - finish: the sweep's summary, and the restart marker or manual request recorded as handled
//     (package trigger writes them) when the sweep reached every volume. A restart sweep that did
//     not is tried again with a doubling wait (untilComplete) until it does.
//
// Around it: targets.go keeps which sidecar serves which driver on which node (from the
// CSIAddonsNodes), history.go what each volume's last probes and heals found, status.go the
// status annotation on the PVC, metrics.go the sweep and heal metrics and the Events that report
// outcomes to operators.
//
// It imports every stage before it (scheduler/*, policy, probe) and none of the binaries.
package healer
