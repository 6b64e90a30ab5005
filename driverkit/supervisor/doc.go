// Package supervisor is a node-level mount supervisor: it holds the FUSE connections of a
// node's volumes, so that the mounters serving them can die, be upgraded, or outlive a restart
// of the node plugin without a workload noticing.
//
// For each volume the node plugin asks it to mount (Mount), it mounts the volume's target with
// fuseconn.Mount and keeps the /dev/fuse descriptor, then starts the driver's mounter on a
// duplicate of it (Options.MounterCommand, with --source, --fuse-fd, --state-dir, --ready-fd,
// --fsname) and waits for its ready line. A FUSE connection lives while any descriptor of it is
// open, so a mounter that dies leaves a live connection whose requests wait in the kernel: the
// supervisor starts a new mounter on the same descriptor with --takeover, at once the first time
// and after a backoff that doubles from then on, at most Options.MaxRestarts times per
// Options.RestartWindow. Past that bound the
// volume is reported failed and the descriptor is still kept, so that the mount never dies of
// it; a new Mount of the volume (a heal) starts a mounter again. Unmount stops the mounter
// gracefully (SIGTERM: it stops serving and leaves the mount), unmounts the target and closes
// the descriptor.
//
// What it holds is bounded (Options.MaxMounts; Mount past it is ErrTooManyMounts) and
// inspectable (Status: each volume's target, mounter PID, restarts, state, FUSE connection ID
// and the connection's waiting requests from /sys/fs/fuse/connections/<id>/waiting; and the
// mounts of the driver's type on the node that nobody holds, which are dead: they are
// reported, never adopted).
//
// # Upgrades: the handover
//
// A new supervisor started on the same Options.StateDir connects to the running one over the
// handover socket (<StateDir>/handover.sock, SOCK_SEQPACKET) and receives the table, each
// volume's descriptor and the listener of the node plugin's socket (SCM_RIGHTS); the running
// one then stops its mounters gracefully, the new one starts a mounter with --takeover on each
// connection, and the old one closes its copies and serves nothing until it is stopped. The
// plugin socket is the same listening socket throughout, so the node plugin's calls are
// queued, never refused. A successor that fails before it has taken over leaves the volumes
// with the running supervisor, which starts its mounters again. An instance that handed its
// volumes over (Options.Instance, such as the pod's name) never takes them back, even when it is
// started again. A supervisor that finds nobody to take over from starts empty.
//
// # The wire
//
// The node plugin's socket carries one JSON request and one JSON answer per connection
// (Client). The callers are the node plugin and `refdriver supervisor status` on the same node;
// the calls are few (one per stage and unstage) and small; both ends are of one source tree.
// A generated gRPC service would add a .proto, its generated code and the gRPC server to a
// process whose whole job is to stay up and hold descriptors, and would still not carry the
// descriptors of the handover, which needs SCM_RIGHTS on a UNIX socket of its own. encoding/json
// keeps the supervisor small and the messages readable with socat when something is wrong.
//
// It imports fuseconn of the project and nothing else of it: it is what a driver links.
package supervisor
