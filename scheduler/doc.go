// Package scheduler is the front of the pipeline: it decides when volumes are looked at, which
// volumes, and in what order their calls go out. Its stages are sub-packages, in the order a
// volume passes through them:
//
//   - trigger: restart sweeps (a CSIAddonsNode's restart marker changed), periodic sweeps (cron
//     schedules per StorageClass) and manual sweeps (an annotation), and the annotations that
//     record them as handled;
//   - planner: the compact informer caches and the selection of a sweep's volumes from them;
//   - dispatch: the queue that runs each volume's calls under the global, per-driver and
//     per-node budgets, one call per volume at a time, with backoff.
//
// This package holds only what they pass along: the Sweep a trigger fires. The policy decision
// between planning and dispatch is package policy; what a volume's task does is package healer.
//
// It imports nothing of the project.
package scheduler
