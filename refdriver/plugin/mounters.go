package plugin

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/volume-healer/volume-healer/driverkit"
	"github.com/volume-healer/volume-healer/refdriver/mounter"
)

// readyFD is the descriptor a mounter reports readiness on: the first of exec.Cmd.ExtraFiles.
const readyFD = 3

// child is a mounter this run of the plugin started; done closes once it is reaped.
type child struct {
	done chan struct{}
}

// Mounter names the userspace mounter a plugin starts for each staged volume.
type Mounter string

const (
	// OwnMounter is the reference driver's own FUSE daemon (package mounter, run as
	// `refdriver mounter`).
	OwnMounter Mounter = "refdriver"
	// RcloneMounter is `rclone mount` of the volume's backing folder: a FUSE daemon nobody
	// here wrote, installed from the distribution's packages, as operators run ceph-fuse or
	// s3fs. It needs the rclone program and fusermount (package fuse3) on the PATH.
	RcloneMounter Mounter = "rclone"
)

// Mounters lists the mounters a plugin can run, for help texts and errors.
var Mounters = []Mounter{OwnMounter, RcloneMounter}

// fsType is the filesystem type the mounts of m show in the mount table.
func (m Mounter) fsType() string {
	if m == RcloneMounter {
		return "fuse.rclone"
	}
	return mounter.FSType
}

// ParseMounter reads a mounter's name.
func ParseMounter(s string) (Mounter, error) {
	for _, m := range Mounters {
		if string(m) == s {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown mounter %q: want %s or %s", s, OwnMounter, RcloneMounter)
}

// mounterArgs are the flags that start the own mounter of a volume. isMounterOf finds the same
// flags in /proc/PID/cmdline.
func mounterArgs(backing string, r *record) []string {
	return []string{"--source", backing, "--target", r.StagingPath, "--fsname", r.FsName, "--ready-fd", strconv.Itoa(readyFD)}
}

// rcloneArgs are the arguments that start `rclone mount` of a volume in the foreground: a
// local folder needs no remote, so no configuration is read (--config /dev/null). The mount
// source in the mount table is the volume's FsName (--devname), which the checks and
// isMounterOf go by. --allow-other lets pods of other users in, as ceph-fuse's allow_other;
// the VFS cache is off so that every write goes to the backing folder at once; directory
// entries are cached as briefly as the own mounter's, since the folder can change behind the
// mount's back (a fault removes it).
func rcloneArgs(backing string, r *record) []string {
	return []string{"mount", backing, r.StagingPath, "--config", "/dev/null", "--devname", r.FsName,
		"--allow-other", "--vfs-cache-mode", "off", "--dir-cache-time", "1s"}
}

// startMounter starts the mounter of r's volume at r.StagingPath and waits until it has
// mounted. The mounter stays in the plugin's process group on purpose (no Setpgid): whoever
// kills the group kills the mounters with it, as a container runtime kills ceph-fuse with its
// node plugin container. It is reaped in the background.
func (p *Plugin) startMounter(ctx context.Context, r *record) (pid int, err error) {
	if r.Supervised {
		return p.superviseMount(ctx, r)
	}
	if r.mounter() == RcloneMounter {
		return p.startRclone(ctx, r)
	}
	return p.startOwnMounter(ctx, r)
}

// startChild starts cmd and reaps it in the background; c.done closes once it is reaped.
func (p *Plugin) startChild(cmd *exec.Cmd) (pid int, c *child, err error) {
	cmd.Stdout, cmd.Stderr = p.opts.MounterOutput, p.opts.MounterOutput
	if err := cmd.Start(); err != nil {
		return 0, nil, fmt.Errorf("%w: start %s: %w", ErrMounter, cmd.Path, err)
	}
	c = &child{done: make(chan struct{})}
	pid = cmd.Process.Pid
	p.mu.Lock()
	p.children[pid] = c
	p.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		p.mu.Lock()
		delete(p.children, pid)
		p.mu.Unlock()
		close(c.done)
	}()
	return pid, c, nil
}

// abandonMounter kills a mounter that did not mount, and says why.
func abandonMounter(pid int, c *child, r *record, why string) error {
	_ = syscall.Kill(pid, syscall.SIGKILL)
	<-c.done
	return fmt.Errorf("%w: the %s mounter of volume %s at %s %s (its output is in the plugin's log)", ErrMounter, r.mounter(), r.VolumeID, r.StagingPath, why)
}

// startOwnMounter starts `refdriver mounter`, which says on a pipe when it has mounted.
func (p *Plugin) startOwnMounter(ctx context.Context, r *record) (pid int, err error) {
	readR, readW, err := os.Pipe()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrMounter, err)
	}
	defer func() { _ = readR.Close() }()

	name := p.opts.MounterCommand[0]
	args := append(slices.Clone(p.opts.MounterCommand[1:]), mounterArgs(p.store.backing(r.VolumeID), r)...)
	cmd := exec.Command(name, args...)
	cmd.ExtraFiles = []*os.File{readW}
	pid, c, err := p.startChild(cmd)
	// The child holds its own copy; without closing ours the read below never sees the end.
	_ = readW.Close()
	if err != nil {
		return 0, err
	}

	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(readR).ReadString('\n')
		line <- s
	}()
	timer := time.NewTimer(p.opts.ReadyTimeout)
	defer timer.Stop()
	var why string
	select {
	case s := <-line:
		if s == mounter.ReadyLine {
			return pid, nil
		}
		why = "exited before it mounted"
	case <-timer.C:
		why = fmt.Sprintf("did not mount within %s", p.opts.ReadyTimeout)
	case <-ctx.Done():
		why = "was abandoned: " + ctx.Err().Error()
	}
	return 0, abandonMounter(pid, c, r, why)
}

// startRclone starts `rclone mount`, which says nothing when it has mounted: the mount table
// does, once the staging path shows a mount of the volume's source and rclone's type.
func (p *Plugin) startRclone(ctx context.Context, r *record) (pid int, err error) {
	name := p.opts.RcloneCommand[0]
	args := append(slices.Clone(p.opts.RcloneCommand[1:]), rcloneArgs(p.store.backing(r.VolumeID), r)...)
	pid, c, err := p.startChild(exec.Command(name, args...))
	if err != nil {
		return 0, err
	}
	timer := time.NewTimer(p.opts.ReadyTimeout)
	defer timer.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	want := r.expect()
	for {
		mounted, err := mountedAs(r.StagingPath, want)
		if err != nil {
			return 0, abandonMounter(pid, c, r, "could not be watched: "+err.Error())
		}
		if mounted {
			return pid, nil
		}
		select {
		case <-tick.C:
		case <-c.done:
			return 0, abandonMounter(pid, c, r, "exited before it mounted")
		case <-timer.C:
			return 0, abandonMounter(pid, c, r, fmt.Sprintf("did not mount within %s", p.opts.ReadyTimeout))
		case <-ctx.Done():
			return 0, abandonMounter(pid, c, r, "was abandoned: "+ctx.Err().Error())
		}
	}
}

// mountedAs tells whether the top-most mount at path has want's source and type, from this
// process's mount table.
func mountedAs(path string, want driverkit.Expect) (bool, error) {
	infos, err := driverkit.ReadMountTable(selfMountInfo)
	if err != nil {
		return false, err
	}
	top := driverkit.TopMount(infos, path)
	return top != nil && top.Source == want.Source && top.FSType == want.FSType, nil
}

// selfMountInfo is this process's mount table.
const selfMountInfo = "/proc/self/mountinfo"

// isMounterOf tells whether pid is alive and is the mounter of r's volume at r's staging path,
// from its command line: a PID recorded by an earlier run may have been reused by any other
// process since, which must never be signalled. A zombie has no command line and does not count.
func isMounterOf(pid int, r *record) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return false
	}
	args := bytes.Split(bytes.TrimSuffix(b, []byte{0}), []byte{0})
	has := func(flag, value string) bool {
		for i := 0; i+1 < len(args); i++ {
			if string(args[i]) == flag && string(args[i+1]) == value {
				return true
			}
		}
		return false
	}
	if r.mounter() == RcloneMounter {
		// rclone mount <source> <mount point> ... --devname <fsName>
		isArg := func(value string) bool {
			return slices.ContainsFunc(args, func(a []byte) bool { return string(a) == value })
		}
		return isArg("mount") && isArg(r.StagingPath) && has("--devname", r.FsName)
	}
	if r.Supervised {
		// The supervisor's mounter serves a descriptor, not a path: --fuse-fd N.
		hasFlag := slices.ContainsFunc(args, func(a []byte) bool { return string(a) == "--fuse-fd" })
		return hasFlag && has("--fsname", r.FsName)
	}
	return has("--target", r.StagingPath) && has("--fsname", r.FsName)
}

// signalMounter sends sig to r's recorded mounter when it is still that volume's mounter;
// sent is false when there is none. A supervised volume's mounter is the one the supervisor
// runs now (it may have restarted it since the record was written).
func (p *Plugin) signalMounter(r *record, sig syscall.Signal) (sent bool, err error) {
	if r.Supervised {
		p.refreshMounterPID(r)
	}
	if !isMounterOf(r.MounterPID, r) {
		return false, nil
	}
	if err := syscall.Kill(r.MounterPID, sig); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return false, nil
		}
		return false, fmt.Errorf("%w: signal %s to the mounter of volume %s (PID %d): %w", ErrMounter, sig, r.VolumeID, r.MounterPID, err)
	}
	return true, nil
}

// stopMounter ends r's recorded mounter. With grace, it asks it to unmount and exit (SIGTERM,
// and SIGCONT in case it is stopped) and waits StopTimeout; then, or without grace, it kills it.
// A mounter that is already gone, or a PID that is no longer this volume's mounter, is left
// alone. With grace, a supervised volume is unmounted by the supervisor instead (the unstage);
// without, its mounter is killed as any other, and the supervisor replaces it on the live
// connection (the fault of a mounter that crashed).
func (p *Plugin) stopMounter(r *record, grace bool) error {
	if grace && r.Supervised {
		ctx, cancel := context.WithTimeout(context.Background(), p.opts.SupervisorTimeout)
		defer cancel()
		if err := p.sup.Unmount(ctx, r.VolumeID); err != nil {
			return fmt.Errorf("%w: the mount supervisor did not unmount volume %s: %w", ErrMounter, r.VolumeID, err)
		}
		return nil
	}
	if grace {
		sent, err := p.signalMounter(r, syscall.SIGTERM)
		if err != nil || !sent {
			return err
		}
		_, _ = p.signalMounter(r, syscall.SIGCONT)
		if p.waitMounterGone(r, p.opts.StopTimeout) {
			return nil
		}
	}
	sent, err := p.signalMounter(r, syscall.SIGKILL)
	if err != nil || !sent {
		return err
	}
	if !p.waitMounterGone(r, 10*time.Second) {
		return fmt.Errorf("%w: the mounter of volume %s (PID %d) is still there after SIGKILL", ErrMounter, r.VolumeID, r.MounterPID)
	}
	return nil
}

// waitMounterGone waits until r's mounter has exited: reaped, when this run started it, or no
// longer found in /proc otherwise.
func (p *Plugin) waitMounterGone(r *record, timeout time.Duration) bool {
	p.mu.Lock()
	c := p.children[r.MounterPID]
	p.mu.Unlock()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	if c != nil {
		select {
		case <-c.done:
			return true
		case <-timer.C:
			return false
		}
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for isMounterOf(r.MounterPID, r) {
		select {
		case <-tick.C:
		case <-timer.C:
			return false
		}
	}
	return true
}

// StopMounters kills the mounters this run of the plugin started (SIGKILL) and waits until each
// is reaped, or until ctx ends; it returns how many it stopped. A node plugin in a container calls
// it before it exits: the runtime kills every process left in the container once its main
// process is gone (runc kill --all for a container in the host's PID namespace) and breaks the
// mounts as surely, but the mounters left behind become children of the runtime's shim, and
// containerd's shim (v2.x) takes about a second for each exit beyond the 32 it buffers while it
// waits for that runc kill, so that with a hundred of them the old pod is reported stopped
// more than a minute late. Mounters of a supervisor or of an earlier run are not this run's and
// are left alone.
func (p *Plugin) StopMounters(ctx context.Context) (int, error) {
	p.mu.Lock()
	children := maps.Clone(p.children)
	p.mu.Unlock()
	for pid := range children {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return 0, fmt.Errorf("%w: kill mounter PID %d: %w", ErrMounter, pid, err)
		}
	}
	stopped := 0
	for pid, c := range children {
		select {
		case <-c.done:
			stopped++
		case <-ctx.Done():
			return stopped, fmt.Errorf("%w: mounter PID %d not reaped after SIGKILL, %d of %d reaped: %w", ErrMounter, pid, stopped, len(children), context.Cause(ctx))
		}
	}
	return stopped, nil
}
