// Package controller assembles and runs the volume-healer controller: it loads nothing itself
// (cmd/volume-healer hands it a config.Config) and wires the pipeline together, from the
// informers to the heal:
//
//   - run.go: Run, in named steps: the clients and the manager (leader election, health
//     checks), the policy engine with its ConfigMap source, the one shared informer factory with
//     the planner's caches, the admission webhooks (policy ConfigMaps, and pods' mount
//     propagation, which reads those caches), the act stage (dispatcher, sidecar client,
//     evictor, sweeper), the triggers, which parts run on every replica or on the leader only, and
//     the run with the Lease's end;
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
