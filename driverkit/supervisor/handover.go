package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The handover runs over a SOCK_SEQPACKET UNIX socket (<StateDir>/handover.sock), whose
// messages keep their bounds and carry descriptors (SCM_RIGHTS):
//
//	successor -> running:  hello {instance}
//	running -> successor:  table {instance, count} + the plugin socket's listener
//	running -> successor:  volume {...} + the volume's /dev/fuse descriptor, count times
//	successor -> running:  received
//	running:               stops its mounters gracefully (SIGTERM: they stop serving, the
//	                       mounts stay, requests wait in the kernel)
//	running -> successor:  stopped
//	successor:             starts a mounter with --takeover on each connection
//	successor -> running:  done; the running one closes its copies and serves nothing more.
//
// The running supervisor keeps its copies of the descriptors until done: a successor that fails
// or dies before it leaves the volumes with it, and it starts its mounters again (--takeover)
// and serves on.
const (
	msgHello    = "hello"
	msgTable    = "table"
	msgVolume   = "volume"
	msgReceived = "received"
	msgStopped  = "stopped"
	msgDone     = "done"
	msgRefused  = "refused"
)

// handoverMsg is one message of the handover.
type handoverMsg struct {
	Type     string        `json:"type"`
	Instance string        `json:"instance,omitempty"`
	Count    int           `json:"count,omitempty"`
	Volume   *handedVolume `json:"volume,omitempty"`
	Error    string        `json:"error,omitempty"`
}

// handedVolume is what a volume's entry carries to the successor, beside its descriptor.
type handedVolume struct {
	Request    MountRequest `json:"request"`
	Since      time.Time    `json:"since"`
	Restarts   int          `json:"restarts"`
	Connection uint64       `json:"connection"`
}

// handoverTimeout bounds each step of the handover that waits for the other side, beside the
// mounters' own timeouts.
const handoverTimeout = 30 * time.Second

func send(c *net.UnixConn, m handoverMsg, f *os.File) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	var oob []byte
	if f != nil {
		oob = unix.UnixRights(int(f.Fd()))
	}
	_ = c.SetWriteDeadline(time.Now().Add(handoverTimeout))
	if _, _, err := c.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("send %s: %w", m.Type, err)
	}
	return nil
}

// receive reads one message of type want, and the descriptor it carries, if any.
func receive(c *net.UnixConn, want string, timeout time.Duration) (handoverMsg, *os.File, error) {
	buf := make([]byte, 1<<16)
	oob := make([]byte, unix.CmsgSpace(4))
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return handoverMsg{}, nil, fmt.Errorf("receive %s: %w", want, err)
	}
	var f *os.File
	if oobn > 0 {
		cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return handoverMsg{}, nil, fmt.Errorf("receive %s: parse its descriptors: %w", want, err)
		}
		for _, cm := range cmsgs {
			fds, err := unix.ParseUnixRights(&cm)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				if f == nil {
					f = os.NewFile(uintptr(fd), want)
				} else {
					_ = unix.Close(fd)
				}
			}
		}
	}
	if n == 0 {
		closeFile(f)
		return handoverMsg{}, nil, fmt.Errorf("receive %s: the other side closed the handover", want)
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeFile(f)
		return handoverMsg{}, nil, fmt.Errorf("receive %s: the message was truncated", want)
	}
	var m handoverMsg
	if err := json.Unmarshal(buf[:n], &m); err != nil {
		closeFile(f)
		return handoverMsg{}, nil, fmt.Errorf("receive %s: %w", want, err)
	}
	if m.Type != want {
		closeFile(f)
		if m.Type == msgRefused {
			return m, nil, fmt.Errorf("the running supervisor refused the handover: %s", m.Error)
		}
		return m, nil, fmt.Errorf("receive %s: got %q", want, m.Type)
	}
	return m, f, nil
}

func closeFile(f *os.File) {
	if f != nil {
		_ = f.Close()
	}
}

// takeOver asks the supervisor running on StateDir for its volumes and the plugin socket's
// listener, and starts a mounter with --takeover on each. It returns a nil listener when no
// supervisor runs there.
func (s *Supervisor) takeOver(ctx context.Context) (*net.UnixListener, error) {
	log := s.opts.Logger
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.handoverSocket(), Net: "unixpacket"})
	if err != nil {
		if isNobody(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("%w: reach the running supervisor at %s: %w", ErrHandover, s.handoverSocket(), err)
	}
	defer func() { _ = c.Close() }()
	fail := func(err error) error {
		return fmt.Errorf("%w from the supervisor at %s: %w", ErrHandover, s.handoverSocket(), err)
	}

	if err := send(c, handoverMsg{Type: msgHello, Instance: s.opts.Instance}, nil); err != nil {
		return nil, fail(err)
	}
	table, lf, err := receive(c, msgTable, handoverTimeout+s.opts.ReadyTimeout)
	if err != nil {
		return nil, fail(err)
	}
	if lf == nil {
		return nil, fail(errors.New("the table came without the plugin socket's listener"))
	}
	var vols []*volume
	cleanup := func() {
		closeFile(lf)
		for _, v := range vols {
			closeFile(v.fd)
		}
	}
	for range table.Count {
		m, f, err := receive(c, msgVolume, handoverTimeout)
		if err == nil && (f == nil || m.Volume == nil) {
			closeFile(f)
			err = errors.New("a volume came without its descriptor")
		}
		if err != nil {
			cleanup()
			return nil, fail(err)
		}
		h := m.Volume
		vols = append(vols, &volume{req: h.Request, fd: f, stateDir: s.mounterStateDir(h.Request.Volume), since: h.Since,
			restarts: h.Restarts, conn: h.Connection, state: StateStopped})
	}
	if err := send(c, handoverMsg{Type: msgReceived}, nil); err != nil {
		cleanup()
		return nil, fail(err)
	}
	log.Info("Received the volumes; waiting for the running supervisor to stop its mounters", "from", table.Instance, "volumes", len(vols))
	if _, _, err := receive(c, msgStopped, handoverTimeout+s.opts.StopTimeout); err != nil {
		cleanup()
		return nil, fail(err)
	}

	start := time.Now()
	s.mu.Lock()
	for _, v := range vols {
		s.volumes[v.req.Volume] = v
	}
	s.tookOverFrom = table.Instance
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, v := range vols {
		wg.Go(func() {
			v.op.Lock()
			defer v.op.Unlock()
			c, err := s.startMounter(ctx, v, true)
			if err != nil {
				log.Error(err, "Mounter did not take its connection over; it is restarted with backoff", "volume", v.req.Volume)
			}
			s.keep(v, c)
		})
	}
	wg.Wait()
	// The instance that handed over never takes the volumes back, even when started again.
	if err := os.WriteFile(filepath.Join(s.retiredDir(), table.Instance), []byte(s.opts.Instance+"\n"), 0o600); err != nil {
		log.Error(err, "Recording the retired instance", "instance", table.Instance)
	}
	if err := send(c, handoverMsg{Type: msgDone}, nil); err != nil {
		// The running supervisor takes the volumes back when it does not hear done: stop
		// the mounters started here, so that no connection has two servers.
		s.release()
		s.mu.Lock()
		s.volumes = map[string]*volume{}
		s.mu.Unlock()
		closeFile(lf)
		return nil, fail(err)
	}
	fl, err := net.FileListener(lf)
	closeFile(lf)
	if err != nil {
		return nil, fail(fmt.Errorf("use the plugin socket's listener: %w", err))
	}
	ln, ok := fl.(*net.UnixListener)
	if !ok {
		_ = fl.Close()
		return nil, fail(fmt.Errorf("the plugin socket's listener is a %T, not a UNIX socket", fl))
	}
	ln.SetUnlinkOnClose(false)
	log.Info("Took the volumes over", "from", table.Instance, "volumes", len(vols), "mountersTook", time.Since(start).Round(time.Millisecond))
	return ln, nil
}

// giveAway hands the volumes and the plugin socket to the successor on c. It returns true when
// the successor took them; else the supervisor serves on as before.
func (s *Supervisor) giveAway(ctx context.Context, c *net.UnixConn, wg *sync.WaitGroup) bool {
	defer func() { _ = c.Close() }()
	log := s.opts.Logger
	hello, _, err := receive(c, msgHello, handoverTimeout)
	if err != nil {
		log.Error(err, "Handover refused")
		return false
	}
	log = log.WithValues("successor", hello.Instance)
	if hello.Instance == s.opts.Instance {
		_ = send(c, handoverMsg{Type: msgRefused, Error: fmt.Sprintf("the successor has this supervisor's own instance name %q", s.opts.Instance)}, nil)
		log.Info("Handover refused: the successor has this supervisor's instance name")
		return false
	}
	log.Info("Handing the volumes over")
	s.mu.Lock()
	ln := s.listener
	s.mu.Unlock()
	if ln == nil {
		_ = send(c, handoverMsg{Type: msgRefused, Error: "this supervisor serves no socket"}, nil)
		return false
	}
	lf, err := ln.File()
	if err != nil {
		_ = send(c, handoverMsg{Type: msgRefused, Error: fmt.Sprintf("duplicate the plugin socket: %v", err)}, nil)
		log.Error(err, "Handover refused")
		return false
	}
	defer closeFile(lf)
	// Calls queued on the socket from now on are the successor's; the calls accepted already
	// end first.
	_ = ln.Close()
	s.mu.Lock()
	s.listener = nil
	s.mu.Unlock()
	s.serving.Lock()
	defer s.serving.Unlock()
	s.mu.Lock()
	vols := make([]*volume, 0, len(s.volumes))
	for _, v := range s.volumes {
		vols = append(vols, v)
	}
	s.mu.Unlock()
	for _, v := range vols {
		v.op.Lock()
	}
	unlockAll := func() {
		for _, v := range vols {
			v.op.Unlock()
		}
	}
	rollback := func(err error) bool {
		log.Error(err, "Handover failed; this supervisor keeps the volumes and serves on")
		s.resume(ctx, vols, lf, wg)
		unlockAll()
		return false
	}

	if err := send(c, handoverMsg{Type: msgTable, Instance: s.opts.Instance, Count: len(vols)}, lf); err != nil {
		return rollback(err)
	}
	for _, v := range vols {
		s.mu.Lock()
		h := &handedVolume{Request: v.req, Since: v.since, Restarts: v.restarts, Connection: v.conn}
		s.mu.Unlock()
		if err := send(c, handoverMsg{Type: msgVolume, Volume: h}, v.fd); err != nil {
			return rollback(err)
		}
	}
	if _, _, err := receive(c, msgReceived, handoverTimeout); err != nil {
		return rollback(err)
	}
	start := time.Now()
	var stops sync.WaitGroup
	for _, v := range vols {
		stops.Go(func() { s.stopKeeper(v) })
	}
	stops.Wait()
	log.Info("Mounters stopped for the successor", "volumes", len(vols), "took", time.Since(start).Round(time.Millisecond))
	if err := send(c, handoverMsg{Type: msgStopped}, nil); err != nil {
		return rollback(err)
	}
	// The successor starts its mounters, each within ReadyTimeout.
	if _, _, err := receive(c, msgDone, handoverTimeout+s.opts.ReadyTimeout); err != nil {
		return rollback(err)
	}
	s.mu.Lock()
	s.state = ServerHandedOver
	s.volumes = map[string]*volume{}
	s.mu.Unlock()
	for _, v := range vols {
		closeFile(v.fd)
		v.fd = nil
		v.gone = true
	}
	unlockAll()
	log.Info("Handed the volumes over; serving nothing, waiting to be stopped", "volumes", len(vols))
	return true
}

// resume takes the volumes back after a failed handover: a mounter with --takeover on each
// whose mounter was stopped, and the plugin socket served again. The caller holds each volume's
// op.
func (s *Supervisor) resume(ctx context.Context, vols []*volume, lf *os.File, wg *sync.WaitGroup) {
	for _, v := range vols {
		if v.keeper != nil {
			continue
		}
		c, err := s.startMounter(ctx, v, true)
		if err != nil {
			s.opts.Logger.Error(err, "Mounter did not take its connection back; it is restarted with backoff", "volume", v.req.Volume)
		}
		s.keep(v, c)
	}
	fl, err := net.FileListener(lf)
	if err != nil {
		s.opts.Logger.Error(err, "The plugin socket cannot be served again after the failed handover")
		return
	}
	ln := fl.(*net.UnixListener)
	ln.SetUnlinkOnClose(false)
	s.serve(ctx, ln, wg)
}
