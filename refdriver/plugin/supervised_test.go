package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/driverkit/supervisor"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// supervisorProc is one run of `refdriver supervisor`, in a process group of its own, as the
// supervisor's container; its mounters are its children, in its group.
type supervisorProc struct {
	instance string
	cmd      *exec.Cmd
	done     chan struct{}
}

// supervised is a node whose plugin stages through a mount supervisor.
type supervised struct {
	*env
	socket, supStateDir string
	sups                []*supervisorProc
}

func newSupervised(t *testing.T) *supervised {
	t.Helper()
	e := newEnv(t)
	s := &supervised{env: e, socket: filepath.Join(e.sockDir, "sup.sock"), supStateDir: t.TempDir()}
	e.args = append(e.args, "--supervisor-socket", s.socket)
	return s
}

// startSupervisor starts a supervisor named instance with more flags and waits until it
// serves the socket.
func (s *supervised) startSupervisor(instance string, flags ...string) *supervisorProc {
	t := s.t
	t.Helper()
	logFile, err := os.OpenFile(filepath.Join(s.stateDir, "supervisor-"+instance+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = logFile.Close() }()
	args := append([]string{"supervisor", "--socket", s.socket, "--state-dir", s.supStateDir, "--instance", instance, "--v", "2"}, flags...)
	sp := &supervisorProc{instance: instance, cmd: exec.Command(refdriverBin, args...), done: make(chan struct{})}
	sp.cmd.Stdout, sp.cmd.Stderr = logFile, logFile
	sp.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := sp.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.sups = append(s.sups, sp)
	go func() {
		_ = sp.cmd.Wait()
		close(sp.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-sp.cmd.Process.Pid, syscall.SIGKILL)
		<-sp.done
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("supervisor %s log:\n%s", instance, b)
		}
	})
	poll.Eventually(t, 30*time.Second, "supervisor "+instance+" serving", func() (bool, string) {
		select {
		case <-sp.done:
			t.Fatalf("supervisor %s exited: %v", instance, sp.cmd.ProcessState)
		default:
		}
		st, err := s.client().Status(context.Background())
		if err != nil {
			return false, err.Error()
		}
		return st.Instance == instance, "served by " + st.Instance
	})
	return sp
}

// startPlugin starts the node plugin. At the end of the test the supervisors are killed before
// it, so that its clean-up does not wait for the supervised mounters, which are not its own.
func (s *supervised) startPlugin() *proc {
	s.t.Helper()
	p := s.start()
	s.t.Cleanup(func() {
		for _, sp := range s.sups {
			_ = syscall.Kill(-sp.cmd.Process.Pid, syscall.SIGKILL)
			<-sp.done
		}
	})
	return p
}

// killPlugin kills the node plugin's process group, as its container dies; the supervised
// mounters are in the supervisor's.
func killPlugin(p *proc) {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

func (s *supervised) client() *supervisor.Client {
	return supervisor.NewClient(s.socket, 30*time.Second)
}

func (s *supervised) volumeStatus(id string) supervisor.VolumeStatus {
	s.t.Helper()
	st, err := s.client().Status(ctx(s.t))
	if err != nil {
		s.t.Fatal(err)
	}
	for _, v := range st.Volumes {
		if v.Volume == id {
			return v
		}
	}
	s.t.Fatalf("the supervisor holds no volume %s: %+v", id, st)
	return supervisor.VolumeStatus{}
}

// holder is a workload that keeps one file open for the whole test, appending a record and
// fsyncing it every interval, and keeps a folder open, looking a name up through it every
// interval. It counts every failed system call and times every write+fsync and lookup.
type holder struct {
	dir      string
	interval time.Duration
	stop     chan struct{}
	wg       sync.WaitGroup

	mu      sync.Mutex
	written int
	fails   []string
	writes  []sample
	lookups []sample
}

// sample is one timed operation.
type sample struct {
	at   time.Time
	took time.Duration
}

func startHolder(t *testing.T, dir string, interval time.Duration) *holder {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "looked-up"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "records"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	d, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	h := &holder{dir: dir, interval: interval, stop: make(chan struct{})}
	h.wg.Go(func() {
		defer func() { _ = f.Close() }()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for seq := 1; ; seq++ {
			select {
			case <-h.stop:
				return
			case <-tick.C:
			}
			start := time.Now()
			_, werr := fmt.Fprintf(f, "%08d\n", seq)
			serr := f.Sync()
			took := time.Since(start)
			h.mu.Lock()
			h.writes = append(h.writes, sample{at: start, took: took})
			switch {
			case werr != nil:
				h.fails = append(h.fails, fmt.Sprintf("write %d at %s: %v", seq, start.Format(time.StampMilli), werr))
				// A failed append leaves no record: the next one takes its number.
				seq--
			case serr != nil:
				h.fails = append(h.fails, fmt.Sprintf("fsync %d at %s: %v", seq, start.Format(time.StampMilli), serr))
				h.written = seq
			default:
				h.written = seq
			}
			h.mu.Unlock()
		}
	})
	h.wg.Go(func() {
		defer func() { _ = unix.Close(d) }()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-tick.C:
			}
			start := time.Now()
			var st unix.Stat_t
			err := unix.Fstatat(d, "looked-up", &st, unix.AT_SYMLINK_NOFOLLOW)
			took := time.Since(start)
			h.mu.Lock()
			h.lookups = append(h.lookups, sample{at: start, took: took})
			if err != nil {
				h.fails = append(h.fails, fmt.Sprintf("lookup at %s: %v", start.Format(time.StampMilli), err))
			}
			h.mu.Unlock()
		}
	})
	return h
}

// mark is now, to cut the samples into phases.
func (h *holder) mark() time.Time { return time.Now() }

// failures are the failed calls so far.
func (h *holder) failures() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.fails)
}

// waitWrites waits until n more records were written after the call.
func (h *holder) waitWrites(t *testing.T, n int) {
	t.Helper()
	h.mu.Lock()
	want := h.written + n
	h.mu.Unlock()
	poll.Eventually(t, 30*time.Second, fmt.Sprintf("%d more records", n), func() (bool, string) {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.written >= want, fmt.Sprintf("%d of %d records", h.written, want)
	})
}

// stalls sums up the samples taken from since to until: p50, p99 and max.
func stalls(samples []sample, since, until time.Time) string {
	var took []time.Duration
	for _, s := range samples {
		if !s.at.Before(since) && s.at.Before(until) {
			took = append(took, s.took)
		}
	}
	if len(took) == 0 {
		return "no samples"
	}
	slices.Sort(took)
	q := func(p float64) time.Duration { return took[int(p*float64(len(took)-1))] }
	return fmt.Sprintf("n=%d p50=%s p99=%s max=%s", len(took), q(0.5).Round(10*time.Microsecond), q(0.99).Round(10*time.Microsecond), took[len(took)-1].Round(10*time.Microsecond))
}

// finish stops the workload and reads every record back through a new open.
func (h *holder) finish(t *testing.T) {
	t.Helper()
	close(h.stop)
	h.wg.Wait()
	b, err := os.ReadFile(filepath.Join(h.dir, "records"))
	if err != nil {
		t.Fatalf("read the records back: %v", err)
	}
	lines := strings.Fields(string(b))
	if len(lines) != h.written {
		t.Errorf("read %d records back, wrote %d", len(lines), h.written)
	}
	for i, l := range lines {
		if n, err := strconv.Atoi(l); err != nil || n != i+1 {
			t.Errorf("record %d reads %q, want %08d", i+1, l, i+1)
			break
		}
	}
}

// TestSupervisedVolumeLivesThroughRestarts runs a workload that keeps a file and a folder of a
// supervised volume open, writing and fsyncing every 20 ms and looking a name up every 20 ms,
// across a kill of the node plugin (and its start again), a kill -9 of the volume's mounter
// while the workload's requests wait on it, and an upgrade of the supervisor (a second one takes
// the volume over, the first one exits). Then a heal of the volume with its mount detached.
// Not one call may fail, every record must read back, and the stalls are reported.
func TestSupervisedVolumeLivesThroughRestarts(t *testing.T) {
	s := newSupervised(t)
	first := s.startSupervisor("sup-a")
	p := s.startPlugin()
	v := p.createStagePublish(s.env, "kept")
	if vs := p.status(v.id); !vs.Supervised {
		t.Fatalf("volume status %+v: not supervised", vs)
	}
	held := s.volumeStatus(v.id)
	if held.State != supervisor.StateRunning || held.Target != v.staging || held.Connection == 0 {
		t.Fatalf("the supervisor holds %+v; want the staging mount running", held)
	}

	h := startHolder(t, v.target, 20*time.Millisecond)
	h.waitWrites(t, 25)
	type phase struct {
		name         string
		since, until time.Time
	}
	var phases []phase
	run := func(name string, act func()) {
		since := h.mark()
		act()
		h.waitWrites(t, 25)
		phases = append(phases, phase{name, since, h.mark()})
		if f := h.failures(); len(f) > 0 {
			t.Fatalf("after %s, %d failed calls: %q", name, len(f), f)
		}
	}

	run("node plugin killed and started again", func() {
		killPlugin(p)
		p = s.startPlugin()
		probe, err := p.healer.ProbeVolume(ctx(t), &healerv1alpha1.ProbeVolumeRequest{VolumeId: v.id, PublishTargetPaths: []string{v.target}})
		if err != nil || len(probe.GetHealthStatuses()) > 0 {
			t.Errorf("probe after the plugin's restart: %v, %v; want healthy with no heal", probe.GetHealthStatuses(), err)
		}
		if now := s.volumeStatus(v.id); now.MounterPID != held.MounterPID || now.Restarts != 0 {
			t.Errorf("after the plugin's restart the supervisor has %+v; want mounter %d untouched", now, held.MounterPID)
		}
	})

	run("mounter killed (SIGKILL) with requests in flight", func() {
		// Stopped first, so that the workload's next calls are in flight when it dies: the
		// kernel holds them (the connection's waiting count) until the next mounter answers.
		if err := syscall.Kill(held.MounterPID, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		poll.Eventually(t, 10*time.Second, "requests waiting on the stopped mounter", func() (bool, string) {
			now := s.volumeStatus(v.id)
			return now.Waiting > 0, fmt.Sprintf("waiting %d", now.Waiting)
		})
		if err := syscall.Kill(held.MounterPID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		poll.Eventually(t, 30*time.Second, "the mounter restarted", func() (bool, string) {
			now := s.volumeStatus(v.id)
			return now.State == supervisor.StateRunning && now.MounterPID != held.MounterPID && now.MounterPID != 0, fmt.Sprintf("%+v", now)
		})
		if now := s.volumeStatus(v.id); now.Restarts != 1 || now.Connection != held.Connection {
			t.Errorf("after the kill the supervisor has %+v; want 1 restart on connection %d", now, held.Connection)
		}
	})

	run("supervisor upgraded (handover)", func() {
		before := s.volumeStatus(v.id)
		second := s.startSupervisor("sup-b")
		now := s.volumeStatus(v.id)
		if now.Connection != held.Connection || now.MounterPID == before.MounterPID || now.State != supervisor.StateRunning {
			t.Errorf("after the handover the new supervisor has %+v; want connection %d with a new mounter", now, held.Connection)
		}
		if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-first.done:
			if !first.cmd.ProcessState.Success() {
				t.Errorf("the old supervisor exited with %v", first.cmd.ProcessState)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("the old supervisor did not exit on SIGTERM")
		}
		_ = second
	})

	h.finish(t)
	if f := h.failures(); len(f) > 0 {
		t.Errorf("%d failed calls: %q", len(f), f)
	}
	t.Logf("stalls of a write+fsync and of a lookup every 20 ms (kernel %s):", kernelRelease())
	for _, ph := range phases {
		t.Logf("  %-50s write+fsync %s; lookup %s", ph.name, stalls(h.writes, ph.since, ph.until), stalls(h.lookups, ph.since, ph.until))
	}

	// A heal of a supervised volume whose mount is dead anyway (here: detached behind
	// everyone's back) asks the supervisor to mount it again, and kills no mounter itself.
	before := s.volumeStatus(v.id)
	if err := unix.Unmount(v.staging, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	heal, err := p.healer.HealVolume(ctx(t), &healerv1alpha1.HealVolumeRequest{VolumeId: v.id})
	if err != nil || len(heal.GetHealthStatuses()) > 0 {
		t.Fatalf("HealVolume of the detached supervised volume = %v, %v; want healed", heal.GetHealthStatuses(), err)
	}
	after := s.volumeStatus(v.id)
	if after.State != supervisor.StateRunning || !after.Since.After(before.Since) || after.MounterPID == before.MounterPID {
		t.Errorf("after the heal the supervisor has %+v; want the volume mounted anew (before: %+v)", after, before)
	}
	if err := writeRead(v.target, "healed", "yes"); err != nil {
		t.Errorf("after the heal: %v", err)
	}

	// Unstaging through the supervisor lets the volume go.
	p.teardown(v)
	if st, err := s.client().Status(ctx(t)); err != nil || len(st.Volumes) != 0 {
		t.Errorf("after the unstage the supervisor holds %+v (%v); want nothing", st.Volumes, err)
	}
	s.expectNothingLeft()
}

// TestSupervisedStageBadInput checks what a stage through the supervisor answers when the
// supervisor refuses it for its bound on mounts, and that a conflicting Mount of a held volume is
// refused naming the volume; neither touches the volume held.
func TestSupervisedStageBadInput(t *testing.T) {
	s := newSupervised(t)
	s.startSupervisor("sup-a", "--max-mounts", "1")
	p := s.startPlugin()
	v := p.createStagePublish(s.env, "first")
	held := s.volumeStatus(v.id)

	created, err := p.controller.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "second", VolumeCapabilities: []*csi.VolumeCapability{mountCapability}})
	if err != nil {
		t.Fatal(err)
	}
	staging := s.stagingPath("second")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	_, err = p.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: created.GetVolume().GetVolumeId(), StagingTargetPath: staging, VolumeCapability: mountCapability})
	if err == nil || !strings.Contains(err.Error(), "max mounts 1") || !strings.Contains(err.Error(), created.GetVolume().GetVolumeId()) {
		t.Errorf("NodeStageVolume past the bound = %v; want an error naming the volume and max mounts 1", err)
	}
	if mps := mountPoints(t, staging); len(mps) > 0 {
		t.Errorf("the refused volume left mounts %v", mps)
	}

	// The conflicting Mount of a held volume, as another caller could send it.
	_, err = s.client().Mount(ctx(t), supervisor.MountRequest{Volume: v.id, Source: "/elsewhere", Target: v.staging, FsName: held.FsName})
	if !errors.Is(err, supervisor.ErrConflict) || !strings.Contains(err.Error(), v.id) {
		t.Errorf("a conflicting Mount = %v; want ErrConflict naming the volume", err)
	}
	if now := s.volumeStatus(v.id); now.MounterPID != held.MounterPID || now.State != supervisor.StateRunning {
		t.Errorf("the held volume after the refusals: %+v; want its mounter %d untouched", now, held.MounterPID)
	}
	if err := writeRead(v.target, "still", "there"); err != nil {
		t.Errorf("the held volume after the refusals: %v", err)
	}
}

// TestSupervisedStageMounterNeverReady checks that a stage through a supervisor whose mounter
// never becomes ready fails within the supervisor's ready timeout, with an error that says so,
// and leaves nothing mounted.
func TestSupervisedStageMounterNeverReady(t *testing.T) {
	s := newSupervised(t)
	never := filepath.Join(s.supStateDir, "never-ready.sh")
	if err := os.WriteFile(never, []byte("#!/bin/sh\nexec sleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	s.startSupervisor("sup-a", "--ready-timeout", "500ms", "--mounter-command", never)
	p := s.startPlugin()
	created, err := p.controller.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "never", VolumeCapabilities: []*csi.VolumeCapability{mountCapability}})
	if err != nil {
		t.Fatal(err)
	}
	id, staging := created.GetVolume().GetVolumeId(), s.stagingPath("never")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = p.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCapability})
	if err == nil || !strings.Contains(err.Error(), "not ready within 500ms") || !strings.Contains(err.Error(), id) {
		t.Errorf("NodeStageVolume with a mounter that never gets ready = %v; want an error naming the volume and the ready timeout", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the refusal took %s", took)
	}
	if mps := mountPoints(t, staging); len(mps) > 0 {
		t.Errorf("the refused volume left mounts %v", mps)
	}
	if st, err := s.client().Status(ctx(t)); err != nil || len(st.Volumes) != 0 {
		t.Errorf("the supervisor holds %+v (%v); want nothing", st.Volumes, err)
	}
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}
