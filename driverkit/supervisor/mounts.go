package supervisor

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/volume-healer/volume-healer/driverkit/fuseconn"
)

// defaultMount mounts with fuseconn.Mount: the volume's fsname, the supervisor's subtype, and
// allow_other, since workloads run as other users than the supervisor.
func defaultMount(subtype string) MountFunc {
	return func(target, fsName string) (*os.File, error) {
		return fuseconn.Mount(target, fuseconn.MountOptions{Subtype: subtype, FsName: fsName, AllowOther: true})
	}
}

// mountEntry is one line of the mount table.
type mountEntry = mountinfo.Info

// mountTable reads the supervisor's mount table; nil when it cannot be read, which then shows
// no mount at all.
func (s *Supervisor) mountTable() []*mountEntry {
	f, err := os.Open(s.opts.MountInfo)
	if err != nil {
		s.opts.Logger.Error(err, "Reading the mount table")
		return nil
	}
	defer func() { _ = f.Close() }()
	infos, err := mountinfo.GetMountsFromReader(f, nil)
	if err != nil {
		s.opts.Logger.Error(err, "Reading the mount table")
		return nil
	}
	return infos
}

// connectionID is the FUSE connection ID of a mount: its device number as the kernel writes it,
// the name of the connection's folder under /sys/fs/fuse/connections.
func connectionID(m *mountEntry) uint64 {
	return uint64(m.Major)<<20 | uint64(m.Minor)
}

// topMount is the mount that path shows: the last one mounted there.
func topMount(table []*mountEntry, path string) *mountEntry {
	path = filepath.Clean(path)
	for _, m := range slices.Backward(table) {
		if m.Mountpoint == path {
			return m
		}
	}
	return nil
}

// connectionOf returns the ID of v's connection when v's target shows a mount of the
// supervisor's type with v's fsname and, once known, v's connection; mounted is false otherwise.
func (s *Supervisor) connectionOf(table []*mountEntry, v *volume) (id uint64, mounted bool) {
	s.mu.Lock()
	conn := v.conn
	s.mu.Unlock()
	m := topMount(table, v.req.Target)
	if m == nil || m.FSType != s.opts.fsType() || m.Source != v.req.FsName {
		return 0, false
	}
	if id := connectionID(m); conn == 0 || id == conn {
		return id, true
	}
	return 0, false
}

// ensureFuseControl mounts the fusectl file system at Options.FuseControl where nothing is
// mounted there yet (systemd mounts it on most distributions, a container or a minimal host may
// not), so that the status can say how many requests wait on each connection. Best effort:
// without it those counts read -1, unknown.
func (s *Supervisor) ensureFuseControl() {
	for _, m := range s.mountTable() {
		if m.Mountpoint == s.opts.FuseControl {
			return
		}
	}
	if err := unix.Mount("fusectl", s.opts.FuseControl, "fusectl", 0, ""); err != nil {
		s.opts.Logger.Info("Cannot mount fusectl: the status will not count the requests waiting on each connection",
			"path", s.opts.FuseControl, "err", err.Error())
		return
	}
	s.opts.Logger.V(2).Info("Mounted fusectl: the status counts the requests waiting on each connection", "path", s.opts.FuseControl)
}

// waiting reads how many requests of a connection wait for an answer; -1 when unknown.
func (s *Supervisor) waiting(conn uint64) int {
	if conn == 0 {
		return -1
	}
	b, err := os.ReadFile(filepath.Join(s.opts.FuseControl, strconv.FormatUint(conn, 10), "waiting"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}

// unheld lists the mounts of the supervisor's type whose connection is not among held: each
// belonged to a supervisor, or a mounter, that is gone. A connection shows once, at its first
// mount point (its binds at publish targets show the same connection).
func (s *Supervisor) unheld(table []*mountEntry, held map[uint64]bool) []UnheldMount {
	var out []UnheldMount
	seen := map[uint64]bool{}
	for _, m := range table {
		if m.FSType != s.opts.fsType() {
			continue
		}
		id := connectionID(m)
		if held[id] || seen[id] {
			continue
		}
		seen[id] = true
		out = append(out, UnheldMount{Target: m.Mountpoint, FsName: m.Source, Connection: id})
	}
	return out
}
