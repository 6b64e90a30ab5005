// Package healer is the act stage of the pipeline. Its Sweeper runs one sweep from a trigger to
// the last heal; each file holds one step of that way down:
//
//   - sweeper.go: the Sweeper, its Options and the interfaces of the stages it calls;
//   - sweep.go: a sweep's life: Run starts it (begin), tries it (attempt), tries an incomplete
//     restart sweep again with an exponential backoff until a try reaches every volume or the
//     restart is superseded (untilComplete), and ends it (finish), recording the restart marker or
//     manual request as handled (package trigger writes them) when the sweep reached every volume;
//   - plan.go: the sweep's volumes: the planner's, or for drivers without VolumeAttachments the
//     volumes the node's sidecar lists as staged;
//   - batch.go: the per-node batch: node by node, several nodes at once, the volumes' decisions
//     go to the dispatcher as soon as a node's are made, so that a node whose sidecar does not
//     answer holds up only its own volumes; the tally of their outcomes;
//   - volume.go: one volume's work: the driver's capabilities and the policy's first decision
//     (prepare), then, as a dispatch.Task, probe, ask the policy again with the probe result, heal
//     and probe once more to verify (act);
//   - driverterms.go: the cache of the driver part of the policy input, shared by a node's volumes.
//
// What the act stage reports: events.go the Events on PVCs and CSIAddonsNodes, status.go the
// status annotation on the PVC, tier.go the driver's tier on its CSIAddonsNode (from the
// capabilities the sidecar answered, for healerctl status), metrics.go the sweep, probe and heal
// metrics. Around it:
// targets.go keeps which sidecar serves which driver on which node (from the CSIAddonsNodes),
// history.go what each volume's last probes and heals found.
//
// It imports every stage before it (scheduler/*, policy, probe) and none of the binaries.
package healer
