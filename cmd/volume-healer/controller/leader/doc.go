// Package leader bounds the calls the controller makes to the sidecars by its hold on the leader
// election Lease, so that two replicas never act on one volume at once, even when a leader is
// killed, frozen, or cut off from the API server and the nodes.
//
// A Lease wraps the lock that client-go's leader elector takes, renews and releases, and so learns
// when each successful renewal was sent. Another replica takes an unreleased Lease over only after
// it has seen no renewal for the Lease's duration, timed on its own clock from the moment it saw
// the last one, which is after that renewal was sent. A call that ends before the last renewal was
// sent plus the Lease's duration, less a margin, therefore ends before any other replica can lead.
// The Lease:
//
//   - gives every call that deadline (Guard): the deadline travels with the call over gRPC, so the
//     sidecar and the driver end the call even when the leader can no longer tell them to;
//   - tells the dispatcher until when calls may start (Until), so none starts once it has passed;
//   - when leadership ends, refuses new calls, cancels those in flight and waits for them to
//     return (End);
//   - releases the Lease only after that, and never once it no longer holds it.
//
// Files: lease.go (the Lease and its lock), errors.go (its sentinel error).
//
// It is wiring of the controller process: it must not import the stages (scheduler, policy,
// healer, probe), which reach it through small interfaces of their own.
package leader
