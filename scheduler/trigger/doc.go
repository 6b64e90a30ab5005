// Package trigger turns object changes and clocks into sweeps (scheduler.Sweep):
//
//   - Restarts: a CSIAddonsNode is created or its restart marker changes (restart.go); the
//     marker that a finished sweep handled is recorded on the object (RecordHandled);
//   - Periodic: cron schedules per StorageClass, from the StorageClass annotation, the
//     configuration's per-class schedule or the default, staggered per node (periodic.go);
//   - Manual: an operator's sweep request annotation on a PVC, StorageClass or CSIAddonsNode,
//     answered by the handled annotation (manual.go).
//
// Every annotation it reads or writes is defined in api/annotations. It hands sweeps to a callback
// and never plans, decides or calls: it must not import the planner, dispatch, policy, probe or
// healer packages.
package trigger
