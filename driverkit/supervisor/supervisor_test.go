package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/volume-healer/volume-healer/driverkit/fuseconn"
	"github.com/volume-healer/volume-healer/driverkit/supervisor"
	"github.com/volume-healer/volume-healer/test/harness"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(fakeMounterEnv); dir != "" {
		os.Exit(runFakeMounter(dir))
	}
	os.Exit(harness.RunUnmountingFuseControl(m))
}

// subtype is the FUSE subtype of the tests' mounts: unique to this test process, so that the
// mounts of a test running beside it never show as unheld here.
var subtype = fmt.Sprintf("svtest%d", os.Getpid())

// node is one node's folders: the supervisors' state and socket, the fake mounter's folder,
// and a root the targets are made under.
type node struct {
	t        *testing.T
	fake     string
	stateDir string
	socket   string
	root     string
}

func newNode(t *testing.T) *node {
	t.Helper()
	harness.RequireRealMounts(t)
	short, err := os.MkdirTemp("", "sv") // a socket path must fit in 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(short) })
	n := &node{t: t, fake: t.TempDir(), stateDir: filepath.Join(short, "state"), socket: filepath.Join(short, "s.sock"), root: t.TempDir()}
	// Before the folders go: no mount must be left under them (nobody serves them, so a walk
	// into one would block).
	t.Cleanup(func() { detachUnder(t, n.root) })
	n.setMode(modeReady)
	return n
}

// detachUnder detaches every mount under dir.
func detachUnder(t *testing.T, dir string) {
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		t.Errorf("read the mount table: %v", err)
		return
	}
	for _, m := range slices.Backward(infos) {
		_ = unix.Unmount(m.Mountpoint, unix.MNT_DETACH)
	}
}

func (n *node) setMode(mode string) {
	n.t.Helper()
	if err := os.WriteFile(filepath.Join(n.fake, "mode"), []byte(mode), 0o600); err != nil {
		n.t.Fatal(err)
	}
}

// starts are the fake mounter's command lines, and "term" for each that SIGTERM stopped.
func (n *node) starts() []string {
	b, _ := os.ReadFile(filepath.Join(n.fake, "starts"))
	return strings.Fields(strings.ReplaceAll(string(b), " ", "\x00"))
}

func (n *node) options(instance string) supervisor.Options {
	exe, err := os.Executable()
	if err != nil {
		n.t.Fatal(err)
	}
	return supervisor.Options{
		StateDir:       n.stateDir,
		Socket:         n.socket,
		Instance:       instance,
		MounterCommand: []string{"env", fakeMounterEnv + "=" + n.fake, exe},
		Subtype:        subtype,
		RestartBackoff: 10 * time.Millisecond,
		ReadyTimeout:   5 * time.Second,
		StopTimeout:    5 * time.Second,
		Logger:         testLogger(n.t),
	}
}

// running is a supervisor started by start; stop ends it and waits for Start to return.
type running struct {
	*supervisor.Supervisor
	stop func()
}

// start runs a supervisor until the test ends or stop is called, and waits until it serves.
func (n *node) start(opts supervisor.Options) *running {
	n.t.Helper()
	s, err := supervisor.New(opts)
	if err != nil {
		n.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			n.t.Errorf("supervisor %s: Start: %v", opts.Instance, err)
		}
	}
	n.t.Cleanup(stop)
	poll.Eventually(n.t, 10*time.Second, "supervisor "+opts.Instance+" serving", func() (bool, string) {
		select {
		case err := <-done:
			done <- err
			return true, "" // Start returned: the caller's checks say why
		default:
		}
		st := s.Status()
		return st.State != supervisor.ServerServing || st.Instance == opts.Instance && socketServes(n.socket, opts.Instance), st.State
	})
	return &running{Supervisor: s, stop: stop}
}

// socketServes tells whether instance answers on socket.
func socketServes(socket, instance string) bool {
	st, err := supervisor.NewClient(socket, time.Second).Status(context.Background())
	return err == nil && st.Instance == instance
}

func (n *node) target(name string) string {
	p := filepath.Join(n.root, name)
	if err := os.MkdirAll(p, 0o750); err != nil {
		n.t.Fatal(err)
	}
	return p
}

func (n *node) request(vol string) supervisor.MountRequest {
	return supervisor.MountRequest{Volume: vol, Source: "/src/" + vol, Target: n.target(vol), FsName: "test:" + vol + ":" + subtype}
}

// mountAt returns the top-most mount at path, nil when there is none.
func mountAt(t *testing.T, path string) *mountinfo.Info {
	t.Helper()
	infos, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) == 0 {
		return nil
	}
	return infos[len(infos)-1]
}

func connectionOf(m *mountinfo.Info) uint64 { return uint64(m.Major)<<20 | uint64(m.Minor) }

func volumeOf(t *testing.T, st supervisor.Status, id string) supervisor.VolumeStatus {
	t.Helper()
	for _, v := range st.Volumes {
		if v.Volume == id {
			return v
		}
	}
	t.Fatalf("volume %s is not in the status: %+v", id, st)
	return supervisor.VolumeStatus{}
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie is not alive: field 3 is the state.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

func TestMountStatusUnmount(t *testing.T) {
	n := newNode(t)
	s := n.start(n.options("a"))
	c := supervisor.NewClient(n.socket, 0)
	req := n.request("vol-1")

	vs, err := c.Mount(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	m := mountAt(t, req.Target)
	if m == nil || m.FSType != "fuse."+subtype || m.Source != req.FsName {
		t.Fatalf("after Mount, %s shows %+v; want a fuse.%s mount of %s", req.Target, m, subtype, req.FsName)
	}
	if vs.State != supervisor.StateRunning || vs.MounterPID == 0 || !alive(vs.MounterPID) || vs.Connection != connectionOf(m) || vs.Restarts != 0 {
		t.Errorf("Mount answered %+v; want a running mounter on connection %d", vs, connectionOf(m))
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/fuse/connections", fmt.Sprint(vs.Connection), "waiting")); err == nil && vs.Waiting < 0 {
		t.Errorf("waiting = %d; the connection's fusectl folder is there", vs.Waiting)
	}
	starts := n.starts()
	if len(starts) != 1 || !strings.Contains(starts[0], "--fuse-fd\x004") || !strings.Contains(starts[0], "--source\x00/src/vol-1") ||
		!strings.Contains(starts[0], "--fsname\x00"+req.FsName) || strings.Contains(starts[0], "--takeover") {
		t.Errorf("mounter command lines = %q; want one, on --fuse-fd 4, without --takeover", starts)
	}

	st, err := c.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := volumeOf(t, st, "vol-1"); got.MounterPID != vs.MounterPID || got.Target != req.Target || got.Since.IsZero() {
		t.Errorf("status = %+v; want the volume as Mount answered it", got)
	}
	if len(st.Unheld) != 0 {
		t.Errorf("unheld = %+v; the only mount is held", st.Unheld)
	}

	if err := c.Unmount(t.Context(), "vol-1"); err != nil {
		t.Fatal(err)
	}
	if m := mountAt(t, req.Target); m != nil {
		t.Errorf("after Unmount, %s still shows %+v", req.Target, m)
	}
	if got := n.starts(); !slices.Equal(got[1:], []string{"term"}) {
		t.Errorf("mounter events = %q; want the mounter stopped by SIGTERM", got)
	}
	if st := s.Status(); len(st.Volumes) != 0 {
		t.Errorf("status after Unmount = %+v; want no volume", st.Volumes)
	}
	// Unmounting a volume not held is done already.
	if err := c.Unmount(t.Context(), "vol-1"); err != nil {
		t.Errorf("second Unmount: %v", err)
	}
}

func TestMountBadInput(t *testing.T) {
	n := newNode(t)
	opts := n.options("a")
	opts.MaxMounts = 2
	n.start(opts)
	c := supervisor.NewClient(n.socket, 0)
	req := n.request("vol-1")
	first, err := c.Mount(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Mount(t.Context(), req)
	if err != nil || again.MounterPID != first.MounterPID || again.Connection != first.Connection {
		t.Errorf("the same Mount again = %+v, %v; want the volume as it was (PID %d)", again, err, first.MounterPID)
	}

	other := n.request("vol-2")
	sameTarget := other
	sameTarget.Target = req.Target
	otherSource := req
	otherSource.Source = "/src/elsewhere"
	tests := map[string]struct {
		req  supervisor.MountRequest
		want error
		says []string
	}{
		"same volume, other source": {otherSource, supervisor.ErrConflict, []string{`volume "vol-1"`, `source "/src/elsewhere", not "/src/vol-1"`}},
		"other volume, same target": {sameTarget, supervisor.ErrConflict, []string{`volume "vol-2"`, req.Target, `held by volume "vol-1"`}},
		"no volume ID":              {supervisor.MountRequest{Source: "/s", Target: "/t", FsName: "f"}, supervisor.ErrInvalidRequest, []string{"volume ID is required"}},
		"relative target":           {supervisor.MountRequest{Volume: "v", Source: "/s", Target: "t", FsName: "f"}, supervisor.ErrInvalidRequest, []string{`volume "v"`, `target "t"`}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := c.Mount(t.Context(), tc.req)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Mount = %v; want %v", err, tc.want)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}

	if _, err := c.Mount(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	third := n.request("vol-3")
	_, err = c.Mount(t.Context(), third)
	if !errors.Is(err, supervisor.ErrTooManyMounts) || !strings.Contains(err.Error(), "max mounts 2") || !strings.Contains(err.Error(), `"vol-3"`) {
		t.Errorf("a third Mount past MaxMounts 2 = %v; want ErrTooManyMounts naming the volume and the bound", err)
	}
	if m := mountAt(t, third.Target); m != nil {
		t.Errorf("the refused volume's target shows %+v", m)
	}
	st, err := c.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Volumes) != 2 || volumeOf(t, st, "vol-1").MounterPID != first.MounterPID {
		t.Errorf("after the refused calls the status is %+v; want vol-1 as it was, and vol-2", st.Volumes)
	}
}

func TestMounterNeverReady(t *testing.T) {
	n := newNode(t)
	opts := n.options("a")
	opts.ReadyTimeout = 300 * time.Millisecond
	n.start(opts)
	c := supervisor.NewClient(n.socket, 0)
	good, err := c.Mount(t.Context(), n.request("vol-1"))
	if err != nil {
		t.Fatal(err)
	}

	n.setMode(modeNever)
	bad := n.request("vol-2")
	start := time.Now()
	_, err = c.Mount(t.Context(), bad)
	if !errors.Is(err, supervisor.ErrMounter) || !strings.Contains(err.Error(), "not ready within 300ms") || !strings.Contains(err.Error(), `"vol-2"`) {
		t.Fatalf("Mount with a mounter that never gets ready = %v; want ErrMounter naming the volume and the ready timeout", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the refusal took %s; the ready timeout is 300ms", took)
	}
	if m := mountAt(t, bad.Target); m != nil {
		t.Errorf("the failed volume's target still shows %+v", m)
	}
	st, err := c.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Volumes) != 1 {
		t.Errorf("status = %+v; want only vol-1", st.Volumes)
	}
	if v := volumeOf(t, st, "vol-1"); v.MounterPID != good.MounterPID || v.State != supervisor.StateRunning || !alive(good.MounterPID) {
		t.Errorf("vol-1 = %+v; want it untouched, PID %d running", v, good.MounterPID)
	}
}

func TestMounterKilledIsRestartedWithTakeover(t *testing.T) {
	n := newNode(t)
	s := n.start(n.options("a"))
	c := supervisor.NewClient(n.socket, 0)
	req := n.request("vol-1")
	first, err := c.Mount(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(first.MounterPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var now supervisor.VolumeStatus
	poll.Eventually(t, 10*time.Second, "a new mounter", func() (bool, string) {
		now = volumeOf(t, s.Status(), "vol-1")
		return now.State == supervisor.StateRunning && now.MounterPID != first.MounterPID && now.MounterPID != 0, fmt.Sprintf("%+v", now)
	})
	if now.Restarts != 1 || now.Connection != first.Connection || !strings.Contains(now.LastError, "killed") {
		t.Errorf("after the kill: %+v; want 1 restart on connection %d, the kill as the last error", now, first.Connection)
	}
	if m := mountAt(t, req.Target); m == nil || connectionOf(m) != first.Connection {
		t.Errorf("the mount at %s is %+v; want connection %d kept", req.Target, m, first.Connection)
	}
	starts := n.starts()
	if len(starts) != 2 || !strings.HasSuffix(starts[1], "--takeover") {
		t.Errorf("mounter command lines = %q; want the second with --takeover", starts)
	}
}

func TestRestartBound(t *testing.T) {
	n := newNode(t)
	opts := n.options("a")
	opts.MaxRestarts = 2
	s := n.start(opts)
	c := supervisor.NewClient(n.socket, 0)
	req := n.request("vol-1")
	n.setMode(modeDie)
	first, err := c.Mount(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	var now supervisor.VolumeStatus
	poll.Eventually(t, 10*time.Second, "the volume failed", func() (bool, string) {
		now = volumeOf(t, s.Status(), "vol-1")
		return now.State == supervisor.StateFailed, fmt.Sprintf("%+v", now)
	})
	if now.Restarts != 2 || now.MounterPID != 0 || len(n.starts()) != 3 {
		t.Errorf("failed volume = %+v after %d starts; want 2 restarts (3 starts) and no mounter", now, len(n.starts()))
	}
	// The connection is kept: the mount does not die.
	if m := mountAt(t, req.Target); m == nil || connectionOf(m) != first.Connection {
		t.Errorf("the failed volume's mount is %+v; want connection %d kept", m, first.Connection)
	}
	// A Mount of the volume (a heal) starts a mounter again on the same connection.
	n.setMode(modeReady)
	again, err := c.Mount(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if again.State != supervisor.StateRunning || again.Connection != first.Connection || !alive(again.MounterPID) {
		t.Errorf("Mount of the failed volume = %+v; want a running mounter on connection %d", again, first.Connection)
	}
	if starts := n.starts(); !strings.HasSuffix(starts[len(starts)-1], "--takeover") {
		t.Errorf("the last mounter command line is %q; want --takeover", starts[len(starts)-1])
	}
}

func TestMountAgainAfterTheMountWasDetached(t *testing.T) {
	n := newNode(t)
	n.start(n.options("a"))
	c := supervisor.NewClient(n.socket, 0)
	req := n.request("vol-1")
	first, err := c.Mount(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(req.Target, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	again, err := c.Mount(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	m := mountAt(t, req.Target)
	// The new connection may reuse the old one's number, which was released first.
	if m == nil || connectionOf(m) != again.Connection || again.MounterPID == first.MounterPID || !again.Since.After(first.Since) {
		t.Errorf("Mount after the detach = %+v, mount %+v; want a new mount and mounter (old: %+v)", again, m, first)
	}
	if starts := n.starts(); strings.HasSuffix(starts[len(starts)-1], "--takeover") {
		t.Errorf("the new connection's mounter was started with --takeover: %q", starts[len(starts)-1])
	}
}

func TestHandover(t *testing.T) {
	n := newNode(t)
	old := n.start(n.options("old"))
	c := supervisor.NewClient(n.socket, 0)
	var before []supervisor.VolumeStatus
	for _, id := range []string{"vol-1", "vol-2"} {
		vs, err := c.Mount(t.Context(), n.request(id))
		if err != nil {
			t.Fatal(err)
		}
		before = append(before, vs)
	}

	successor := n.start(n.options("new"))
	st, err := c.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Instance != "new" || st.TookOverFrom != "old" || st.State != supervisor.ServerServing || len(st.Volumes) != 2 {
		t.Fatalf("the socket's status after the handover = %+v; want instance new, taken over from old, both volumes", st)
	}
	for _, b := range before {
		now := volumeOf(t, st, b.Volume)
		if now.Connection != b.Connection || now.MounterPID == b.MounterPID || now.State != supervisor.StateRunning || !now.Since.Equal(b.Since) {
			t.Errorf("%s after the handover = %+v; want connection %d, a new running mounter, since %s", b.Volume, now, b.Connection, b.Since)
		}
		if alive(b.MounterPID) {
			t.Errorf("%s: the old supervisor's mounter (PID %d) still runs", b.Volume, b.MounterPID)
		}
		if m := mountAt(t, b.Target); m == nil || connectionOf(m) != b.Connection {
			t.Errorf("%s: the mount is %+v; want connection %d", b.Volume, m, b.Connection)
		}
	}
	starts := n.starts()
	var terms, takeovers int
	for _, s := range starts {
		if s == "term" {
			terms++
		}
		if strings.HasSuffix(s, "--takeover") {
			takeovers++
		}
	}
	if terms != 2 || takeovers != 2 {
		t.Errorf("mounter events = %q; want both old mounters stopped by SIGTERM and two started with --takeover", starts)
	}
	if st := old.Status(); st.State != supervisor.ServerHandedOver || len(st.Volumes) != 0 {
		t.Errorf("the old supervisor's status = %+v; want handed-over, holding nothing", st)
	}
	if _, err := old.Mount(t.Context(), n.request("vol-3")); !errors.Is(err, supervisor.ErrHandedOver) {
		t.Errorf("Mount on the old supervisor = %v; want ErrHandedOver", err)
	}
	// The new one serves the calls.
	if _, err := c.Mount(t.Context(), n.request("vol-3")); err != nil {
		t.Fatal(err)
	}
	old.stop()

	// The old instance, started again, takes nothing back.
	again := n.start(n.options("old"))
	if st := again.Status(); st.State != supervisor.ServerRetired {
		t.Errorf("the old instance started again: %+v; want retired", st)
	}
	if st := successor.Status(); len(st.Volumes) != 3 || st.State != supervisor.ServerServing {
		t.Errorf("the successor after the old instance came back: %+v; want it serving its 3 volumes", st)
	}
}

func TestStartEmptyReportsUnheldMounts(t *testing.T) {
	n := newNode(t)
	target := n.target("orphan")
	// A mount whose holder is gone: its descriptor is closed at once.
	f, err := fuseconn.Mount(target, fuseconn.MountOptions{Subtype: subtype, FsName: "test:orphan"})
	if err != nil {
		t.Fatal(err)
	}
	m := mountAt(t, target)
	_ = f.Close()

	s := n.start(n.options("a"))
	st := s.Status()
	if st.TookOverFrom != "" || len(st.Volumes) != 0 {
		t.Errorf("status = %+v; want an empty supervisor", st)
	}
	want := supervisor.UnheldMount{Target: target, FsName: "test:orphan", Connection: connectionOf(m)}
	if !slices.Contains(st.Unheld, want) {
		t.Errorf("unheld = %+v; want %+v reported", st.Unheld, want)
	}
	// Reported, not adopted: a Mount at its target replaces it with a new connection.
	vs, err := s.Mount(t.Context(), supervisor.MountRequest{Volume: "vol-1", Source: "/src", Target: target, FsName: "test:vol-1"})
	if err != nil {
		t.Fatal(err)
	}
	if m := mountAt(t, target); m == nil || m.Source != "test:vol-1" || connectionOf(m) != vs.Connection {
		t.Errorf("the target shows %+v; want the new mount of test:vol-1", m)
	}
	if infos, _ := mountinfo.GetMounts(mountinfo.SingleEntryFilter(target)); len(infos) != 1 {
		t.Errorf("the target has %d mounts; want the dead one detached", len(infos))
	}
	if st := s.Status(); len(st.Unheld) != 0 {
		t.Errorf("unheld after the replacement = %+v; want none", st.Unheld)
	}
}

// TestHandoverFailsAndTheRunningOneKeepsTheVolumes plays a successor that dies in the middle of
// the handover, after the running supervisor stopped its mounters: the running one must take the
// volumes back (new mounters with --takeover on the same connections) and serve on.
func TestHandoverFailsAndTheRunningOneKeepsTheVolumes(t *testing.T) {
	n := newNode(t)
	old := n.start(n.options("old"))
	c := supervisor.NewClient(n.socket, 0)
	before, err := c.Mount(t.Context(), n.request("vol-1"))
	if err != nil {
		t.Fatal(err)
	}

	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: filepath.Join(n.stateDir, "handover.sock"), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	sendMsg := func(typ string) {
		t.Helper()
		if _, err := conn.Write([]byte(`{"type":"` + typ + `","instance":"doomed"}`)); err != nil {
			t.Fatal(err)
		}
	}
	readMsg := func(want string) {
		t.Helper()
		buf, oob := make([]byte, 1<<16), make([]byte, 64)
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		nb, noob, _, _, err := conn.ReadMsgUnix(buf, oob)
		if err != nil {
			t.Fatalf("read %s: %v", want, err)
		}
		if !strings.Contains(string(buf[:nb]), `"type":"`+want+`"`) {
			t.Fatalf("got %s, want %s", buf[:nb], want)
		}
		// Close the descriptors received, as a successor that dies does.
		if cmsgs, err := unix.ParseSocketControlMessage(oob[:noob]); err == nil {
			for _, cm := range cmsgs {
				fds, _ := unix.ParseUnixRights(&cm)
				for _, fd := range fds {
					_ = unix.Close(fd)
				}
			}
		}
	}
	sendMsg("hello")
	readMsg("table")
	readMsg("volume")
	sendMsg("received")
	readMsg("stopped")
	_ = conn.Close()

	var now supervisor.VolumeStatus
	poll.Eventually(t, 30*time.Second, "the running supervisor took the volume back", func() (bool, string) {
		st := old.Status()
		if st.State != supervisor.ServerServing || len(st.Volumes) != 1 {
			return false, fmt.Sprintf("%+v", st)
		}
		now = st.Volumes[0]
		return now.State == supervisor.StateRunning && now.MounterPID != before.MounterPID && now.MounterPID != 0, fmt.Sprintf("%+v", now)
	})
	if now.Connection != before.Connection {
		t.Errorf("vol-1 after the failed handover: %+v; want connection %d", now, before.Connection)
	}
	if starts := n.starts(); !slices.Contains(starts, "term") || !strings.HasSuffix(starts[len(starts)-1], "--takeover") {
		t.Errorf("mounter events = %q; want the mounter stopped for the handover and started again with --takeover", starts)
	}
	// It still serves the socket, and the next successor gets the volume.
	if _, err := c.Mount(t.Context(), n.request("vol-2")); err != nil {
		t.Fatalf("Mount after the failed handover: %v", err)
	}
	n.start(n.options("new"))
	if st, err := c.Status(t.Context()); err != nil || st.Instance != "new" || len(st.Volumes) != 2 {
		t.Errorf("after a second handover the socket answers %+v (%v); want new with both volumes", st, err)
	}
}
