package kubelet_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"
	corev1 "k8s.io/api/core/v1"

	"github.com/volume-healer/volume-healer/test/harness/poll"
	"github.com/volume-healer/volume-healer/test/kubelet"
)

// publishedVolume stages and publishes a volume of a fake driver and returns the Kubelet and the
// publish path.
func publishedVolume(t *testing.T) (*kubelet.Kubelet, string) {
	t.Helper()
	ctx := testContext(t)
	_, conn := serveFakeNode(t, true)
	k := newKubelet(t)
	vol := kubelet.Volume{DriverName: "fake.csi.example.com", Handle: "vol-1", PVName: "pv-1"}
	if err := k.Stage(ctx, conn, vol); err != nil {
		t.Fatal(err)
	}
	target, err := k.Publish(ctx, conn, vol, "pod-1")
	if err != nil {
		t.Fatal(err)
	}
	return k, target
}

// startWorkload starts a workload that is stopped when the test ends; its output is logged if the
// test fails.
func startWorkload(t *testing.T, o kubelet.WorkloadOptions) *kubelet.Workload {
	t.Helper()
	out := &syncBuffer{}
	o.Bin, o.Log = workloadBin, out
	if o.Dir == "" {
		o.Dir = filepath.Join(t.TempDir(), "volume")
	}
	w, err := kubelet.StartWorkload(testContext(t), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
		if t.Failed() {
			t.Logf("workload %s output:\n%s", w.Name(), out.String())
		}
	})
	return w
}

func TestWorkloadSeesHealByPropagation(t *testing.T) {
	requireRoot(t)
	tests := map[string]struct {
		propagation corev1.MountPropagationMode
		seesHeal    bool
	}{
		"HostToContainer sees a mount stacked on the publish path": {corev1.MountPropagationHostToContainer, true},
		"Bidirectional sees a mount stacked on the publish path":   {corev1.MountPropagationBidirectional, true},
		"None keeps the mount it started with":                     {corev1.MountPropagationNone, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			k, target := publishedVolume(t)
			dir := filepath.Join(t.TempDir(), "volume")
			w := startWorkload(t, kubelet.WorkloadOptions{Target: target, Propagation: tc.propagation, Dir: dir, Name: "app"})
			if _, err := w.WaitOK(ctx, time.Time{}); err != nil {
				t.Fatal(err)
			}
			// Its writes reach the volume: the staged tmpfs, which the publish path binds.
			staging := k.StagingPath("fake.csi.example.com", "vol-1")
			if _, err := os.Stat(filepath.Join(staging, w.DataFile())); err != nil {
				t.Fatalf("the workload's data file on the staged volume: %v", err)
			}

			// A heal: a new file system stacked on the publish path, as a driver stacks a new
			// bind of a remounted staging path on the dead one.
			healed := time.Now()
			if err := syscall.Mount("tmpfs", target, "tmpfs", 0, "size=1m"); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(target, "HEALED"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			// A few good iterations after the heal, so that one that sees it has surely run.
			after := healed
			for range 4 {
				r, err := w.WaitOK(ctx, after)
				if err != nil {
					t.Fatal(err)
				}
				after = r.Time
			}

			// What the workload sees, through its own mount namespace.
			_, err := os.Stat(filepath.Join(fmt.Sprintf("/proc/%d/root", w.Pid()), w.Dir(), "HEALED"))
			if sees := err == nil; sees != tc.seesHeal {
				t.Errorf("the workload sees the new file system: %v, want %v (stat: %v)", sees, tc.seesHeal, err)
			}
			// Where its writes go, seen from the host.
			_, err = os.Stat(filepath.Join(target, w.DataFile()))
			if writes := err == nil; writes != tc.seesHeal {
				t.Errorf("the workload's data file is on the new file system: %v, want %v (stat: %v)", writes, tc.seesHeal, err)
			}
		})
	}
}

func TestWorkloadReportsOutage(t *testing.T) {
	requireRoot(t)
	ctx := testContext(t)
	_, target := publishedVolume(t)
	w := startWorkload(t, kubelet.WorkloadOptions{Target: target, Propagation: corev1.MountPropagationHostToContainer, Interval: 20 * time.Millisecond})
	if _, err := w.WaitOK(ctx, time.Time{}); err != nil {
		t.Fatal(err)
	}

	// Break the volume: a read-only file system on top of it.
	broken := time.Now()
	if err := syscall.Mount("tmpfs", target, "tmpfs", syscall.MS_RDONLY, "size=1m"); err != nil {
		t.Fatal(err)
	}
	failure, err := w.WaitFailure(ctx, broken)
	if err != nil {
		t.Fatal(err)
	}
	if failure.Op != "open" || failure.Err != syscall.EROFS.Error() {
		t.Errorf("failed iteration %v: want open failing with %q", failure, syscall.EROFS.Error())
	}
	if o, ok := w.Outage(broken); !ok || o.Over() {
		t.Errorf("Outage during the outage = %+v, %v; want one that is not over", o, ok)
	}

	// Repair it: the unmount reaches the workload's namespace too.
	repaired := time.Now()
	if err := syscall.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	good, err := w.WaitOK(ctx, repaired)
	if err != nil {
		t.Fatal(err)
	}

	o, ok := w.Outage(broken)
	if !ok || !o.Over() {
		t.Fatalf("Outage after the repair = %+v, %v; want one that is over", o, ok)
	}
	if o.FirstFailure.Seq != failure.Seq {
		t.Errorf("outage began with %v, want the first failure %v", o.FirstFailure, failure)
	}
	if o.Recovery.Time.After(good.Time) || !o.Recovery.Time.After(o.FirstFailure.Time) {
		t.Errorf("outage recovered at %v: want after the first failure %v, at or before %v", o.Recovery, o.FirstFailure, good)
	}
	if o.Duration() <= 0 || o.Duration() > good.Time.Sub(broken) {
		t.Errorf("outage lasted %s: want more than 0, at most %s", o.Duration(), good.Time.Sub(broken))
	}
	if n := len(w.FailuresSince(broken)); n != o.Failures || n == 0 {
		t.Errorf("FailuresSince = %d failures, Outage counts %d: want the same, more than 0", n, o.Failures)
	}
	if rs := w.Results(); len(rs) == 0 || rs[len(rs)-1].Seq != int64(len(rs)) {
		t.Errorf("Results: want every iteration, numbered from 1; got %d, the last %v", len(rs), rs[len(rs)-1])
	}
}

func TestStopEndsWorkload(t *testing.T) {
	requireRoot(t)
	ctx := testContext(t)
	_, target := publishedVolume(t)
	w, err := kubelet.StartWorkload(ctx, kubelet.WorkloadOptions{Bin: workloadBin, Target: target, Propagation: corev1.MountPropagationHostToContainer})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", w.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if theirs == self {
		t.Errorf("the workload runs in this process's mount namespace %s, want one of its own", self)
	}

	if err := w.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	select {
	case <-w.Done():
	default:
		t.Error("Done is not closed after Stop")
	}
	if err := syscall.Kill(w.Pid(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("process %d after Stop: want it gone, kill(0) says %v", w.Pid(), err)
	}
	if err := w.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestStartWorkloadReportsSetupFailure(t *testing.T) {
	requireRoot(t)
	missing := filepath.Join(t.TempDir(), "no-such-volume")
	w, err := kubelet.StartWorkload(testContext(t), kubelet.WorkloadOptions{Bin: workloadBin, Target: missing, Dir: filepath.Join(t.TempDir(), "v")})
	if err == nil {
		_ = w.Stop()
		t.Fatal("StartWorkload on a missing target succeeded, want an error")
	}
	if !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), syscall.ENOENT.Error()) {
		t.Errorf("error %q: want it to name %s and say %q", err, missing, syscall.ENOENT.Error())
	}
}

// A test binary killed with SIGKILL (a timeout, Ctrl-C) leaves no workload, and so no mount
// namespace, behind.
func TestWorkloadDiesWithItsStarter(t *testing.T) {
	requireRoot(t)
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), orphanDirEnv+"="+t.TempDir(), orphanBinEnv+"="+workloadBin)
	// Should this process die first, the helper goes with it.
	helper.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	helper.Stderr = &stderr
	stdout, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = helper.Process.Kill()
			_ = helper.Wait()
		}
	})
	var pid int
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if _, scanErr := fmt.Sscanf(line, "pid %d", &pid); err != nil || scanErr != nil {
		t.Fatalf("helper's first line %q (%v): want its workload's PID; stderr: %s", line, err, stderr.String())
	}
	if !running(pid) {
		t.Fatalf("workload %d is not running before its starter is killed", pid)
	}

	killed = true
	_ = helper.Process.Kill()
	_ = helper.Wait()
	if err := poll.Until(t.Context(), 10*time.Second, fmt.Sprintf("workload %d to die with its starter", pid), poll.True(func() bool { return !running(pid) })); err != nil {
		// It is ours to clean up, but the test has failed.
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("%v", err)
	}
}

// running says whether process pid exists and has not exited: a zombie that nobody reaped holds
// no mount namespace.
func running(pid int) bool {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return false
	}
	stat, err := p.Stat()
	return err == nil && stat.State != "Z" && stat.State != "X"
}

// syncBuffer is a bytes.Buffer that a workload may write while a test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
