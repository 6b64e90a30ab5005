package supervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"time"
)

// ReadyLine is what a mounter writes on its ready descriptor once it serves the connection.
const ReadyLine = "ready\n"

// The descriptors a mounter gets: exec.Cmd.ExtraFiles start at 3.
const (
	readyFD = 3
	fuseFD  = 4
)

// child is a running mounter.
type child struct {
	pid int
	// exited closes once the mounter is reaped; err is then why it exited.
	exited chan struct{}
	err    error
}

// mounterArgs are the flags the supervisor appends to MounterCommand.
func mounterArgs(v *volume, takeover bool) []string {
	args := []string{"--source", v.req.Source, "--fuse-fd", strconv.Itoa(fuseFD), "--state-dir", v.stateDir,
		"--ready-fd", strconv.Itoa(readyFD), "--fsname", v.req.FsName}
	if takeover {
		args = append(args, "--takeover")
	}
	return args
}

// startMounter starts a mounter on v's connection and waits for its ready line. A mounter that
// exits first, or is not ready within ReadyTimeout, is killed, and the error says which. The
// caller holds v.op and no other mounter of v runs.
func (s *Supervisor) startMounter(ctx context.Context, v *volume, takeover bool) (*child, error) {
	readR, readW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("%w: volume %q: %w", ErrMounter, v.req.Volume, err)
	}
	defer func() { _ = readR.Close() }()
	cmd := exec.Command(s.opts.MounterCommand[0], append(slices.Clone(s.opts.MounterCommand[1:]), mounterArgs(v, takeover)...)...)
	cmd.ExtraFiles = []*os.File{readW, v.fd}
	cmd.Stdout, cmd.Stderr = s.opts.MounterOutput, s.opts.MounterOutput
	err = cmd.Start()
	// The mounter has its own copy; without closing ours the read below never sees the end.
	_ = readW.Close()
	if err != nil {
		return nil, fmt.Errorf("%w: volume %q: start %s: %w", ErrMounter, v.req.Volume, s.opts.MounterCommand[0], err)
	}
	c := &child{pid: cmd.Process.Pid, exited: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()

	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(readR).ReadString('\n')
		line <- l
	}()
	timer := time.NewTimer(s.opts.ReadyTimeout)
	defer timer.Stop()
	var why string
	select {
	case l := <-line:
		if l == ReadyLine {
			s.mu.Lock()
			v.pid, v.state, v.mounterSince = c.pid, StateRunning, time.Now()
			s.mu.Unlock()
			return c, nil
		}
		<-c.exited
		why = fmt.Sprintf("exited before it was ready (%v)", c.err)
	case <-timer.C:
		why = fmt.Sprintf("was not ready within %s (ready timeout); it was killed", s.opts.ReadyTimeout)
	case <-ctx.Done():
		why = "was abandoned before it was ready: " + context.Cause(ctx).Error()
	}
	_ = syscall.Kill(c.pid, syscall.SIGKILL)
	<-c.exited
	err = fmt.Errorf("%w: volume %q: the mounter %s (PID %d) %s; its output is in the supervisor's log",
		ErrMounter, v.req.Volume, s.opts.MounterCommand[0], c.pid, why)
	s.mu.Lock()
	v.pid, v.lastError = 0, err.Error()
	s.mu.Unlock()
	return nil, err
}

// stopChild asks a mounter to stop (SIGTERM: stop serving, leave the mount) and kills it when it
// has not exited within StopTimeout.
func (s *Supervisor) stopChild(v *volume, c *child) {
	_ = syscall.Kill(c.pid, syscall.SIGTERM)
	// A stopped mounter (SIGSTOP) acts on SIGTERM only once it continues.
	_ = syscall.Kill(c.pid, syscall.SIGCONT)
	timer := time.NewTimer(s.opts.StopTimeout)
	defer timer.Stop()
	select {
	case <-c.exited:
		return
	case <-timer.C:
	}
	s.opts.Logger.Info("Mounter did not stop in time; killing it", "volume", v.req.Volume, "pid", c.pid, "stopTimeout", s.opts.StopTimeout)
	_ = syscall.Kill(c.pid, syscall.SIGKILL)
	<-c.exited
}

// keeper runs one volume's mounter: it restarts a mounter that dies, until it is stopped.
type keeper struct {
	stop    chan struct{}
	stopped chan struct{}
}

// keep starts a keeper of v with c running, or with none running (c nil), which it then starts
// after the backoff. The caller holds v.op and v has no keeper.
func (s *Supervisor) keep(v *volume, c *child) {
	k := &keeper{stop: make(chan struct{}), stopped: make(chan struct{})}
	v.keeper = k
	go func() {
		defer close(k.stopped)
		s.runKeeper(v, k, c)
	}()
}

// stopKeeper stops v's keeper and the mounter it runs, gracefully. The caller holds v.op.
func (s *Supervisor) stopKeeper(v *volume) {
	if v.keeper == nil {
		return
	}
	close(v.keeper.stop)
	<-v.keeper.stopped
	v.keeper = nil
}

// runKeeper restarts v's mounter each time it dies, with --takeover on the same connection: at
// once the first time within RestartWindow, then after a backoff that doubles with each restart;
// past MaxRestarts within the window it gives up and reports the volume failed, keeping the
// connection.
func (s *Supervisor) runKeeper(v *volume, k *keeper, c *child) {
	log := s.opts.Logger.WithValues("volume", v.req.Volume, "target", v.req.Target)
	for {
		if c != nil {
			select {
			case <-k.stop:
				s.stopChild(v, c)
				s.mu.Lock()
				v.pid, v.state = 0, StateStopped
				s.mu.Unlock()
				return
			case <-c.exited:
			}
			why := fmt.Sprintf("the mounter (PID %d) exited: %v", c.pid, c.err)
			if c.err == nil {
				why = fmt.Sprintf("the mounter (PID %d) exited with status 0", c.pid)
			}
			log.Info("Mounter exited", "pid", c.pid, "err", fmt.Sprint(c.err))
			s.mu.Lock()
			v.pid, v.lastError = 0, why
			s.mu.Unlock()
			c = nil
		}
		delay, ok := s.nextRestart(v)
		if !ok {
			s.mu.Lock()
			v.state = StateFailed
			s.mu.Unlock()
			log.Error(errors.New("restart bound reached"), "Volume failed: its mounter died too often; the connection is kept, its requests wait",
				"maxRestarts", s.opts.MaxRestarts, "restartWindow", s.opts.RestartWindow)
			<-k.stop
			return
		}
		s.mu.Lock()
		v.state = StateRestarting
		s.mu.Unlock()
		timer := time.NewTimer(delay)
		select {
		case <-k.stop:
			timer.Stop()
			s.mu.Lock()
			v.state = StateStopped
			s.mu.Unlock()
			return
		case <-timer.C:
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-k.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		next, err := s.startMounter(ctx, v, true)
		cancel()
		if err != nil {
			select {
			case <-k.stop:
				s.mu.Lock()
				v.state = StateStopped
				s.mu.Unlock()
				return
			default:
			}
			log.Error(err, "Mounter restart failed")
			continue
		}
		log.Info("Mounter restarted on the held connection", "pid", next.pid, "after", delay)
		c = next
	}
}

// nextRestart counts a restart of v and returns the backoff before it; ok is false when
// MaxRestarts restarts were made within RestartWindow already.
func (s *Supervisor) nextRestart(v *volume) (delay time.Duration, ok bool) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	v.recent = slices.DeleteFunc(v.recent, func(t time.Time) bool { return now.Sub(t) >= s.opts.RestartWindow })
	if len(v.recent) >= s.opts.MaxRestarts {
		return 0, false
	}
	// The first death in the window is restarted at once: its requests wait meanwhile. A
	// mounter that keeps dying is restarted ever more slowly.
	if len(v.recent) > 0 {
		delay = s.opts.RestartBackoff
	}
	for range max(len(v.recent)-1, 0) {
		delay *= 2
		if delay >= s.opts.MaxRestartBackoff {
			delay = s.opts.MaxRestartBackoff
			break
		}
	}
	v.recent = append(v.recent, now)
	v.restarts++
	return delay, true
}
