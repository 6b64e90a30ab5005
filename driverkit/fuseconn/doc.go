// Package fuseconn serves a FUSE connection in a way that outlives the process serving it.
//
// A FUSE connection lives as long as any descriptor of its /dev/fuse open file is open. Mount
// opens /dev/fuse and mounts it, and returns the descriptor: whoever holds it (a supervisor) keeps
// the connection alive when the server process dies, and hands a duplicate of it to the next
// server. A Session serves a mounted descriptor: started normally it answers the kernel's INIT
// request; started to take over (Options.Takeover) it answers no INIT, reads the parameters the
// first server negotiated back from its state directory, asks the kernel to resend every request
// the dead server read and never answered (FUSE_NOTIFY_RESEND, Linux 6.9, protocol 7.40), and
// serves on. A State journals what the kernel holds the server to (node ids and their lookup
// counts, open file handles) so that a takeover answers for them.
//
// What a file system does with each request is the Handler's. Interrupts are not acted on: a
// request runs to its end and is answered.
//
// It is what a driver links (docs/driver-authors.md) and imports nothing of the project.
package fuseconn
