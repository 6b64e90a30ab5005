// Package dispatch runs tasks, one per volume and sweep, under budgets: a bound on calls in
// flight globally, per driver and per node; at most one call per volume at any time, across
// sweeps (a second task for a busy volume is merged into the queued one); restart sweeps before
// manual before periodic ones; per-volume exponential backoff after failures; a timeout on every
// call; and, given the leader election Lease, no call once the time this replica is known to lead
// has passed. A DaemonSet rollout, where every node plugin restarts at once, becomes an orderly
// queue instead of a heal storm.
//
// Files: options.go (what a caller hands it: a Task, the Result it gets back, the Options and
// their defaults, the Lease), dispatcher.go (the Dispatcher, its loop and the life of a call),
// budgets.go (which ready jobs may start under the global, per-driver and per-node budgets and the
// Lease, and the slots a call takes and gives back), queue.go (volume and job state, the order of
// jobs), lanes.go (the per-driver, per-node lanes and the fair order between nodes), metrics.go
// (its instruments), errors.go (how a task's error is handled).
//
// A task is opaque to it: it must not import the planner, policy, probe or healer packages.
package dispatch
