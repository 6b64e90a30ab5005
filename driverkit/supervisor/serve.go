package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// Start takes over the volumes of the supervisor running on StateDir, if any (the handover),
// or starts empty, and serves the node plugin's socket and the handover socket until ctx ends
// or a successor took the volumes over; a supervisor that handed its volumes over then only
// waits for ctx. When ctx ends while it holds volumes, it stops their mounters gracefully and
// lets the connections go: with no holder left their mounts are dead.
//
// An instance that handed its volumes over once (Options.Instance) takes nothing back when it
// is started again: it serves nothing and waits for ctx.
func (s *Supervisor) Start(ctx context.Context) error {
	log := s.opts.Logger
	for _, dir := range []string{s.opts.StateDir, s.mountersDir(), s.retiredDir(), filepath.Dir(s.opts.Socket)} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("supervisor: create %s: %w", dir, err)
		}
	}
	s.ensureFuseControl()
	if _, err := os.Stat(filepath.Join(s.retiredDir(), s.opts.Instance)); err == nil {
		s.mu.Lock()
		s.state = ServerRetired
		s.mu.Unlock()
		log.Info("This instance handed its volumes over before; it takes nothing back and serves nothing", "instance", s.opts.Instance)
		<-ctx.Done()
		return nil
	}

	ln, err := s.takeOver(ctx)
	if err != nil {
		return err
	}
	if ln == nil {
		if ln, err = s.listenFresh(); err != nil {
			return err
		}
		st := s.Status()
		for _, m := range st.Unheld {
			log.Info("Found a mount of the driver's type that nobody holds: it is dead, and reported, not adopted",
				"target", m.Target, "fsName", m.FsName, "connection", m.Connection)
		}
		log.Info("Started with no supervisor to take over from", "unheld", len(st.Unheld))
	}
	hl, err := listenUnix("unixpacket", s.handoverSocket())
	if err != nil {
		ln.Close()
		return fmt.Errorf("supervisor: %w", err)
	}
	log.Info("Serving", "socket", s.opts.Socket, "handover", s.handoverSocket(), "instance", s.opts.Instance, "maxMounts", s.opts.MaxMounts)

	var wg sync.WaitGroup
	s.serve(ctx, ln, &wg)
	wg.Go(func() { s.acceptHandovers(ctx, hl, &wg) })
	<-ctx.Done()
	_ = hl.Close()
	s.mu.Lock()
	if s.listener != nil {
		_ = s.listener.Close()
		s.listener = nil
	}
	s.mu.Unlock()
	wg.Wait()
	s.release()
	return nil
}

// listenFresh listens on the plugin socket, replacing a file left by a supervisor that is gone;
// a socket that still answers is another supervisor's, which is an error.
func (s *Supervisor) listenFresh() (*net.UnixListener, error) {
	if c, err := net.Dial("unix", s.opts.Socket); err == nil {
		_ = c.Close()
		return nil, fmt.Errorf("supervisor: another supervisor serves %s but answered on no handover socket at %s; stop it, or give this one other folders",
			s.opts.Socket, s.handoverSocket())
	}
	ln, err := listenUnix("unix", s.opts.Socket)
	if err != nil {
		return nil, fmt.Errorf("supervisor: %w", err)
	}
	return ln, nil
}

// listenUnix listens on a UNIX socket at path, replacing a stale file. The socket file stays
// when the listener closes: after a handover the successor serves on it.
func listenUnix(network, path string) (*net.UnixListener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("remove the stale socket %s: %w", path, err)
	}
	ln, err := net.ListenUnix(network, &net.UnixAddr{Name: path, Net: network})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	return ln, nil
}

// serve accepts the node plugin's calls on ln until ln is closed.
func (s *Supervisor) serve(ctx context.Context, ln *net.UnixListener, wg *sync.WaitGroup) {
	s.mu.Lock()
	s.listener = ln
	s.mu.Unlock()
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					s.opts.Logger.Error(err, "Accepting on the plugin socket")
				}
				return
			}
			wg.Go(func() { s.serveConn(ctx, c) })
		}
	})
}

// acceptHandovers hands the volumes to the first successor that asks and succeeds.
func (s *Supervisor) acceptHandovers(ctx context.Context, hl *net.UnixListener, wg *sync.WaitGroup) {
	for {
		c, err := hl.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.opts.Logger.Error(err, "Accepting on the handover socket")
			}
			return
		}
		if s.giveAway(ctx, c, wg) {
			_ = hl.Close()
			return
		}
	}
}

// release stops every mounter gracefully and closes every connection the supervisor holds,
// when it stops without a successor.
func (s *Supervisor) release() {
	s.serving.Lock()
	defer s.serving.Unlock()
	s.mu.Lock()
	vols := make([]*volume, 0, len(s.volumes))
	for _, v := range s.volumes {
		vols = append(vols, v)
	}
	s.mu.Unlock()
	if len(vols) == 0 {
		return
	}
	s.opts.Logger.Info("Stopping with no successor: the held mounts die with their connections", "volumes", len(vols))
	var wg sync.WaitGroup
	for _, v := range vols {
		wg.Go(func() {
			v.op.Lock()
			defer v.op.Unlock()
			s.stopKeeper(v)
			if v.fd != nil {
				_ = v.fd.Close()
				v.fd = nil
			}
		})
	}
	wg.Wait()
}

// isNobody tells whether a dial error means no supervisor listens.
func isNobody(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}
