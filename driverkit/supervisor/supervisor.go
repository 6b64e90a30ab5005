package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Supervisor holds the FUSE connections of a node's volumes and keeps a mounter serving each.
type Supervisor struct {
	opts Options

	// serving is held for reading by every Mount and Unmount, and for writing by a handover,
	// which so waits for the calls in flight and keeps new ones out.
	serving sync.RWMutex

	mu sync.Mutex
	// volumes are the volumes held, by ID. An entry changes under its op lock; mu guards the
	// map and the fields documented so.
	volumes map[string]*volume
	// state is one of ServerServing, ServerHandedOver, ServerRetired.
	state string
	// tookOverFrom names the instance the volumes came from.
	tookOverFrom string
	// listener is the plugin socket's listener while the supervisor serves it.
	listener *net.UnixListener
}

// volume is one held volume.
type volume struct {
	req      MountRequest
	fd       *os.File
	stateDir string
	since    time.Time

	// op serialises the calls that change the volume: Mount, Unmount and a handover.
	op sync.Mutex

	// The fields below are guarded by Supervisor.mu.
	// conn is the FUSE connection's ID, from the mount table once mounted.
	conn         uint64
	state        string
	pid          int
	restarts     int
	recent       []time.Time
	mounterSince time.Time
	lastError    string
	// gone is set once the volume left the table; a Mount that waited on op starts again.
	gone bool

	// keeper is the goroutine that runs the volume's mounter, nil when none runs.
	keeper *keeper
}

// New checks opts and returns a supervisor that holds nothing yet; Start takes over the
// volumes of a running supervisor, or starts empty, and serves.
func New(opts Options) (*Supervisor, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	return &Supervisor{opts: opts, volumes: map[string]*volume{}, state: ServerServing}, nil
}

func (s *Supervisor) handoverSocket() string { return filepath.Join(s.opts.StateDir, "handover.sock") }
func (s *Supervisor) retiredDir() string     { return filepath.Join(s.opts.StateDir, "retired") }
func (s *Supervisor) mountersDir() string    { return filepath.Join(s.opts.StateDir, "mounters") }

// mounterStateDir is the state folder of a volume's mounters: one per connection, kept across
// the mounters that take it over.
func (s *Supervisor) mounterStateDir(id string) string {
	return filepath.Join(s.mountersDir(), url.PathEscape(id))
}

// validate checks a Mount request.
func (r MountRequest) validate() error {
	switch {
	case r.Volume == "":
		return fmt.Errorf("%w: the volume ID is required", ErrInvalidRequest)
	case r.Source == "":
		return fmt.Errorf("%w: volume %q: the source is required", ErrInvalidRequest, r.Volume)
	case r.FsName == "":
		return fmt.Errorf("%w: volume %q: the fsname is required", ErrInvalidRequest, r.Volume)
	case !filepath.IsAbs(r.Target) || filepath.Clean(r.Target) != r.Target:
		return fmt.Errorf("%w: volume %q: the target %q must be a clean absolute path", ErrInvalidRequest, r.Volume, r.Target)
	}
	return nil
}

// differences names the arguments in which two requests for the same volume differ.
func (r MountRequest) differences(o MountRequest) string {
	var d []string
	if r.Source != o.Source {
		d = append(d, fmt.Sprintf("source %q, not %q", r.Source, o.Source))
	}
	if r.Target != o.Target {
		d = append(d, fmt.Sprintf("target %q, not %q", r.Target, o.Target))
	}
	if r.FsName != o.FsName {
		d = append(d, fmt.Sprintf("fsname %q, not %q", r.FsName, o.FsName))
	}
	return fmt.Sprint(d)
}

// Mount mounts the volume at req.Target, starts its mounter and returns once the mounter is
// ready. A volume held already with the same arguments is left as it is when its mount and
// mounter are up; a mount whose mounter failed gets a new mounter that takes the connection
// over; a mount that is gone (detached, or its connection aborted) is made again. A volume held
// with other arguments is ErrConflict, a volume past MaxMounts ErrTooManyMounts.
func (s *Supervisor) Mount(ctx context.Context, req MountRequest) (VolumeStatus, error) {
	if err := req.validate(); err != nil {
		return VolumeStatus{}, err
	}
	s.serving.RLock()
	defer s.serving.RUnlock()
	for {
		v, created, err := s.reserve(req)
		if err != nil {
			return VolumeStatus{}, err
		}
		v.op.Lock()
		s.mu.Lock()
		gone := v.gone
		s.mu.Unlock()
		if gone {
			// Unmounted while this call waited: mount it anew.
			v.op.Unlock()
			continue
		}
		defer v.op.Unlock()
		if created {
			err = s.mountNew(ctx, v)
		} else {
			err = s.mountAgain(ctx, v)
		}
		if err != nil {
			return VolumeStatus{}, err
		}
		return s.volumeStatus(v, s.mountTable()), nil
	}
}

// reserve returns the volume's entry, made (and marked created) when the volume is not held.
func (s *Supervisor) reserve(req MountRequest) (v *volume, created bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != ServerServing {
		return nil, false, fmt.Errorf("%w: volume %q: this supervisor (%s) is %s", ErrHandedOver, req.Volume, s.opts.Instance, s.state)
	}
	if v, ok := s.volumes[req.Volume]; ok {
		if v.req != req {
			return nil, false, fmt.Errorf("%w: volume %q is held with other arguments: %s; unmount it first", ErrConflict, req.Volume, req.differences(v.req))
		}
		return v, false, nil
	}
	for _, o := range s.volumes {
		if o.req.Target == req.Target {
			return nil, false, fmt.Errorf("%w: volume %q: target %s is held by volume %q", ErrConflict, req.Volume, req.Target, o.req.Volume)
		}
	}
	if len(s.volumes) >= s.opts.MaxMounts {
		return nil, false, fmt.Errorf("%w: volume %q: this supervisor holds %d volumes, its bound (max mounts %d); unmount one or raise the bound",
			ErrTooManyMounts, req.Volume, len(s.volumes), s.opts.MaxMounts)
	}
	v = &volume{req: req, stateDir: s.mounterStateDir(req.Volume), state: StateRestarting}
	s.volumes[req.Volume] = v
	return v, true, nil
}

// drop takes v out of the table. The caller holds v.op.
func (s *Supervisor) drop(v *volume) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.volumes[v.req.Volume] == v {
		delete(s.volumes, v.req.Volume)
	}
	v.gone = true
}

// mountNew makes the volume's mount and starts its first mounter; on failure nothing of the
// volume is left. The caller holds v.op.
func (s *Supervisor) mountNew(ctx context.Context, v *volume) error {
	log := s.opts.Logger.WithValues("volume", v.req.Volume, "target", v.req.Target)
	err := s.mountConnection(v)
	if err == nil {
		var c *child
		c, err = s.startMounter(ctx, v, false)
		if err == nil {
			s.keep(v, c)
			log.Info("Volume mounted", "pid", c.pid, "fsName", v.req.FsName)
			return nil
		}
		err = errors.Join(err, s.releaseConnection(v))
	}
	s.drop(v)
	log.Error(err, "Volume not mounted")
	return err
}

// mountConnection mounts v's target and keeps the new connection's descriptor in v, with a
// mounter state folder of its own. The caller holds v.op.
func (s *Supervisor) mountConnection(v *volume) error {
	if err := s.detachDead(v); err != nil {
		return err
	}
	if err := os.MkdirAll(v.req.Target, 0o750); err != nil {
		return fmt.Errorf("%w: volume %q: create target %s: %w", ErrMount, v.req.Volume, v.req.Target, err)
	}
	// A new connection: what an earlier mounter recorded is of another.
	if err := os.RemoveAll(v.stateDir); err != nil {
		return fmt.Errorf("%w: volume %q: clear the mounter state folder %s: %w", ErrMounter, v.req.Volume, v.stateDir, err)
	}
	if err := os.MkdirAll(v.stateDir, 0o700); err != nil {
		return fmt.Errorf("%w: volume %q: create the mounter state folder %s: %w", ErrMounter, v.req.Volume, v.stateDir, err)
	}
	fd, err := s.opts.Mount(v.req.Target, v.req.FsName)
	if err != nil {
		return fmt.Errorf("%w: volume %q at %s: %w", ErrMount, v.req.Volume, v.req.Target, err)
	}
	v.fd = fd
	var conn uint64
	if m := topMount(s.mountTable(), v.req.Target); m != nil {
		conn = connectionID(m)
	}
	s.mu.Lock()
	v.conn = conn
	v.since = time.Now()
	v.restarts, v.recent, v.lastError = 0, nil, ""
	s.mu.Unlock()
	return nil
}

// detachDead detaches the mounts of the supervisor's type at v's target whose connections
// nobody holds: they are dead (ENOTCONN), and the new mount goes where they were. The caller
// holds v.op.
func (s *Supervisor) detachDead(v *volume) error {
	for {
		m := topMount(s.mountTable(), v.req.Target)
		if m == nil || m.FSType != s.opts.fsType() || s.held(connectionID(m)) {
			return nil
		}
		if err := unix.Unmount(v.req.Target, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("%w: volume %q: detach the dead mount of %s at %s: %w", ErrMount, v.req.Volume, m.Source, v.req.Target, err)
		}
		s.opts.Logger.Info("Detached a dead mount nobody held from the volume's target", "volume", v.req.Volume, "target", v.req.Target,
			"fsName", m.Source, "connection", connectionID(m))
	}
}

// held tells whether a held volume has connection id.
func (s *Supervisor) held(id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.volumes {
		if v.conn == id {
			return true
		}
	}
	return false
}

// releaseConnection unmounts v's target when v's connection is mounted there and closes the
// descriptor, which ends the connection. The caller holds v.op and no mounter runs.
func (s *Supervisor) releaseConnection(v *volume) error {
	if v.fd == nil {
		return nil
	}
	var errs []error
	if conn, ok := s.connectionOf(s.mountTable(), v); ok && conn != 0 {
		if err := unix.Unmount(v.req.Target, 0); err != nil {
			// Busy: a workload holds a file open, a publish bind is still up. Detach, so
			// that the mount goes once the last user lets go.
			if derr := unix.Unmount(v.req.Target, unix.MNT_DETACH); derr != nil {
				errs = append(errs, fmt.Errorf("%w: volume %q: unmount %s: %w", ErrMount, v.req.Volume, v.req.Target, errors.Join(err, derr)))
			}
		}
	}
	if err := v.fd.Close(); err != nil {
		errs = append(errs, fmt.Errorf("%w: volume %q: close its FUSE descriptor: %w", ErrMount, v.req.Volume, err))
	}
	v.fd = nil
	s.mu.Lock()
	v.conn = 0
	s.mu.Unlock()
	if err := os.RemoveAll(v.stateDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("%w: volume %q: remove the mounter state folder: %w", ErrMounter, v.req.Volume, err))
	}
	return errors.Join(errs...)
}

// mountAgain handles a Mount of a volume held already with the same arguments. The caller holds
// v.op.
func (s *Supervisor) mountAgain(ctx context.Context, v *volume) error {
	log := s.opts.Logger.WithValues("volume", v.req.Volume, "target", v.req.Target)
	_, mounted := s.connectionOf(s.mountTable(), v)
	s.mu.Lock()
	state := v.state
	s.mu.Unlock()
	switch {
	case mounted && state == StateRunning:
		return nil
	case mounted:
		// The mounter failed (or waits for its next restart): a new one takes the live
		// connection over now, with a fresh restart budget.
		s.stopKeeper(v)
		s.mu.Lock()
		v.recent = nil
		s.mu.Unlock()
		c, err := s.startMounter(ctx, v, true)
		if err == nil {
			s.keep(v, c)
			log.Info("Mounter started again on the held connection", "pid", c.pid)
			return nil
		}
		// A connection no mounter can take over (aborted, or its state is unusable) is
		// replaced, as a lost one is.
		log.Error(err, "No mounter could take the held connection over; mounting the volume again")
		if rerr := s.releaseConnection(v); rerr != nil {
			log.Error(rerr, "Releasing the connection")
		}
		return s.mountNew(ctx, v)
	default:
		// The mount is gone: detached by someone, or its connection aborted. Its requests can
		// no longer be answered; a new connection replaces it.
		s.stopKeeper(v)
		if err := s.releaseConnection(v); err != nil {
			log.Error(err, "Releasing the lost connection")
		}
		log.Info("The held mount is gone; mounting the volume again")
		return s.mountNew(ctx, v)
	}
}

// Unmount stops the volume's mounter gracefully, unmounts its target and closes its connection.
// A volume not held is no error.
func (s *Supervisor) Unmount(ctx context.Context, volumeID string) error {
	if volumeID == "" {
		return fmt.Errorf("%w: the volume ID is required", ErrInvalidRequest)
	}
	s.serving.RLock()
	defer s.serving.RUnlock()
	s.mu.Lock()
	if s.state != ServerServing {
		s.mu.Unlock()
		return fmt.Errorf("%w: volume %q: this supervisor (%s) is %s", ErrHandedOver, volumeID, s.opts.Instance, s.state)
	}
	v, ok := s.volumes[volumeID]
	s.mu.Unlock()
	if !ok {
		return nil
	}
	v.op.Lock()
	defer v.op.Unlock()
	if v.gone {
		return nil
	}
	s.stopKeeper(v)
	err := s.releaseConnection(v)
	s.drop(v)
	if err != nil {
		return err
	}
	s.opts.Logger.Info("Volume unmounted", "volume", volumeID, "target", v.req.Target)
	return nil
}

// Status reports what the supervisor holds, and the mounts of its type that nobody holds.
func (s *Supervisor) Status() Status {
	table := s.mountTable()
	s.mu.Lock()
	vols := slices.Collect(maps.Values(s.volumes))
	st := Status{Instance: s.opts.Instance, PID: os.Getpid(), State: s.state, TookOverFrom: s.tookOverFrom, MaxMounts: s.opts.MaxMounts}
	s.mu.Unlock()
	slices.SortFunc(vols, func(a, b *volume) int { return compareStrings(a.req.Volume, b.req.Volume) })
	held := map[uint64]bool{}
	st.Volumes = []VolumeStatus{}
	for _, v := range vols {
		vs := s.volumeStatus(v, table)
		st.Volumes = append(st.Volumes, vs)
		if vs.Connection != 0 {
			held[vs.Connection] = true
		}
	}
	if st.State == ServerServing {
		st.Unheld = s.unheld(table, held)
	}
	return st
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// volumeStatus reports v, with its connection found in table.
func (s *Supervisor) volumeStatus(v *volume, table []*mountEntry) VolumeStatus {
	conn, _ := s.connectionOf(table, v)
	s.mu.Lock()
	vs := VolumeStatus{
		MountRequest: v.req,
		State:        v.state,
		MounterPID:   v.pid,
		Restarts:     v.restarts,
		Since:        v.since,
		MounterSince: v.mounterSince,
		Connection:   conn,
		LastError:    v.lastError,
	}
	s.mu.Unlock()
	vs.Waiting = s.waiting(conn)
	return vs
}
