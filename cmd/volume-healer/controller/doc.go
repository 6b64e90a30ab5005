// Package controller assembles and runs the volume-healer controller: it loads nothing itself
// (cmd/volume-healer hands it a config.Config) and wires the pipeline together, from the
// informers to the heal:
//
//   - run.go: the manager (leader election, health checks), the one shared informer factory,
//     the policy engine and its ConfigMap source, the policy admission webhook, the planner, the
//     dispatcher, the sweeper and the triggers, and which of them run on every replica or on the
//     leader only;
//   - events.go: informer events routed to the sidecar targets and the triggers;
//   - sweeps.go: the runner that starts each sweep a trigger fires, once caches and policy are
//     ready;
//   - lease.go: the leader election Lease lock, wrapped in the leader.Lease that bounds every call
//     to the sidecars;
//   - sidecars.go: the client of the sidecars (TLS, token) from the configuration;
//   - metrics.go: the /metrics server of the controller's own registry.
//
// It is the only package that imports every stage; no stage imports it.
package controller
