// Package healer is the act stage of the pipeline. Its Sweeper runs one sweep from a trigger to
// the last heal, in three steps:
//
//   - plan (sweeper.go, Run and plan): the planner's volumes for the sweep, or for drivers
//     without VolumeAttachments the volumes the node's sidecar lists as staged;
//   - submit: per volume the driver's capabilities, the policy's decision, and a dispatch.Task
//     that probes, asks the policy again with the probe result, heals and probes once more;
//   - finish: the sweep's summary, and the restart marker or manual request recorded as handled
//     (package trigger writes them).
//
// Around it: targets.go keeps which sidecar serves which driver on which node (from the
// CSIAddonsNodes), history.go what each volume's last probes and heals found, status.go the
// status annotation on the PVC, metrics.go the sweep and heal metrics and the Events that report
// outcomes to operators.
//
// It imports every stage before it (scheduler/*, policy, probe) and none of the binaries.
package healer
