package nodeprobe_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/driverkit"
	"github.com/volume-healer/volume-healer/sidecar/nodeprobe"
)

// requireMounts skips a test that cannot mount here (not root; no /dev/fuse when fuse is set),
// and fails it with CI=true, where a missing privilege means the CI job is wrong.
func requireMounts(t *testing.T, fuse bool) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	if _, err := os.Stat("/dev/fuse"); fuse && err != nil {
		missing = append(missing, "/dev/fuse")
	}
	if len(missing) == 0 {
		return
	}
	msg := "this test mounts file systems and needs " + strings.Join(missing, " and ")
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI=true, so a missing privilege is a failure)", msg)
	}
	t.Skip(msg)
}

// unmountAtEnd removes every mount at path when the test ends, lazily, since a dead or frozen
// mount cannot be unmounted otherwise.
func unmountAtEnd(t *testing.T, path string) {
	t.Cleanup(func() {
		for i := 0; i < 16 && isMounted(t, path); i++ {
			if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", path, err)
				return
			}
		}
	})
}

func isMounted(t *testing.T, path string) bool {
	infos, err := driverkit.ReadMountTable("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	return driverkit.TopMount(infos, path) != nil
}

func mountTmpfs(t *testing.T, path string) {
	t.Helper()
	if err := unix.Mount("nodeprobe-test", path, "tmpfs", 0, "size=4m"); err != nil {
		t.Fatalf("mount tmpfs at %s: %v", path, err)
	}
	unmountAtEnd(t, path)
}

func bind(t *testing.T, from, to string) {
	t.Helper()
	if err := unix.Mount(from, to, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind %s at %s: %v", from, to, err)
	}
	unmountAtEnd(t, to)
}

// daemon is the reference driver's FUSE mounter, run by this test binary as a process of its
// own.
type daemon struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// startMounter serves a new folder at target with the reference driver's mounter.
func startMounter(t *testing.T, target string) *daemon {
	t.Helper()
	source := t.TempDir()
	if err := os.WriteFile(filepath.Join(source, "data"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: exec.Command("/proc/self/exe"), exited: make(chan struct{})}
	d.cmd.Env = append(os.Environ(), mounterEnv+"="+source+":"+target)
	d.cmd.Stderr = os.Stderr
	out, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	unmountAtEnd(t, target)
	t.Cleanup(d.kill)
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- line
		_ = d.cmd.Wait()
		close(d.exited)
	}()
	select {
	case line := <-ready:
		if line != "ready\n" {
			t.Fatalf("the mounter at %s said %q, not ready", target, line)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the mounter at %s was not ready within 20s", target)
	}
	return d
}

// kill kills the daemon and waits until it is gone; a stopped daemon dies too.
func (d *daemon) kill() {
	_ = d.cmd.Process.Kill()
	<-d.exited
}

// children lists the processes whose parent is this one, but the ones in except.
func children(t *testing.T, except ...int) []string {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, file := range stats {
		b, err := os.ReadFile(file)
		if err != nil {
			continue // gone meanwhile
		}
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(file)))
		if len(fields) > 1 && fields[1] == strconv.Itoa(os.Getpid()) && !slices.Contains(except, pid) {
			out = append(out, strings.TrimSpace(s))
		}
	}
	return out
}

// probe probes vol-1 of pv-1 and returns its reasons by path.
func probe(t *testing.T, p *nodeprobe.Prober, k *kubeletDir) ([]string, []driverkit.Finding) {
	t.Helper()
	_, findings, err := p.Probe(context.Background(), nodeprobe.Request{Driver: testDriver, Handle: "vol-1", PV: "pv-1"})
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	return reasons(k.dir, findings), findings
}

// realVolume is a volume staged and published for two pods in kubelet's layout, with real
// mounts: the staging path mounted by mountStaging, each target a bind mount of it.
func realVolume(t *testing.T, mountStaging func(staging string)) (k *kubeletDir, staging string, targets []string) {
	t.Helper()
	k = newKubeletDir(t)
	staging = k.stage(testDriver, "vol-1", "pv-1")
	mountStaging(staging)
	for _, pod := range []string{"pod-a", "pod-b"} {
		target := k.publish(pod, testDriver, "vol-1", "pv-1")
		bind(t, staging, target)
		targets = append(targets, target)
	}
	return k, staging, targets
}

func stagingRel(staging string) string {
	return "plugins/kubernetes.io/csi/" + testDriver + "/" + filepath.Base(filepath.Dir(staging)) + "/globalmount"
}

func TestProbeRealMounts(t *testing.T) {
	t.Run("healthy tmpfs and its bind mounts", func(t *testing.T) {
		requireMounts(t, false)
		k, _, _ := realVolume(t, func(s string) { mountTmpfs(t, s) })
		if got, findings := probe(t, nodeprobe.New(nodeprobe.Options{KubeletDir: k.dir}), k); len(got) != 0 {
			t.Fatalf("a healthy volume: %+v", findings)
		}
	})
	t.Run("a publish target unmounted behind kubelet's back", func(t *testing.T) {
		requireMounts(t, false)
		k, _, targets := realVolume(t, func(s string) { mountTmpfs(t, s) })
		if err := unix.Unmount(targets[1], 0); err != nil {
			t.Fatal(err)
		}
		got, findings := probe(t, nodeprobe.New(nodeprobe.Options{KubeletDir: k.dir}), k)
		want := healerv1alpha1.ReasonPublishTargetNotMounted + "@pods/pod-b/volumes/kubernetes.io~csi/pv-1/mount"
		if len(got) != 1 || got[0] != want || !strings.Contains(findings[0].Message, "node's own disk") {
			t.Fatalf("findings %q (%+v), want %s saying writes go to the node's disk", got, findings, want)
		}
	})
	t.Run("a FUSE mount whose daemon was killed", func(t *testing.T) {
		requireMounts(t, true)
		var d *daemon
		k, staging, _ := realVolume(t, func(s string) { d = startMounter(t, s) })
		d.kill()
		got, findings := probe(t, nodeprobe.New(nodeprobe.Options{KubeletDir: k.dir}), k)
		want := []string{
			"MountDisconnected@" + stagingRel(staging),
			"MountDisconnected@pods/pod-a/volumes/kubernetes.io~csi/pv-1/mount",
			"MountDisconnected@pods/pod-b/volumes/kubernetes.io~csi/pv-1/mount",
		}
		if strings.Join(got, " ") != strings.Join(sorted(want), " ") || !strings.Contains(findings[0].Message, "ENOTCONN") {
			t.Fatalf("findings %q (%+v), want %q with ENOTCONN", got, findings, want)
		}
	})
	t.Run("targets still on the dead mount after the staging path was mounted again", func(t *testing.T) {
		requireMounts(t, true)
		var d *daemon
		k, staging, _ := realVolume(t, func(s string) { d = startMounter(t, s) })
		d.kill()
		// What a driver's NodeStage does with a corrupted staging path: detach it, mount again.
		if err := unix.Unmount(staging, unix.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
		startMounter(t, staging)
		got, findings := probe(t, nodeprobe.New(nodeprobe.Options{KubeletDir: k.dir}), k)
		want := []string{
			"StaleMountInPods@pods/pod-a/volumes/kubernetes.io~csi/pv-1/mount",
			"StaleMountInPods@pods/pod-b/volumes/kubernetes.io~csi/pv-1/mount",
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("findings %q (%+v), want %q", got, findings, want)
		}
	})
	t.Run("a FUSE mount whose daemon is stopped", func(t *testing.T) {
		requireMounts(t, true)
		var d *daemon
		k, staging, _ := realVolume(t, func(s string) { d = startMounter(t, s) })
		// The product's default: a -race build of the mounter can take over a second to answer
		// a healthy mount's stat on a loaded machine.
		const timeout = 5 * time.Second
		p := nodeprobe.New(nodeprobe.Options{KubeletDir: k.dir, Stat: nodeprobe.StatterOptions{Timeout: timeout}})
		if got, findings := probe(t, p, k); len(got) != 0 {
			t.Fatalf("before the daemon stops: %+v", findings)
		}
		goroutines := runtime.NumGoroutine()
		if err := d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		waitStopped(t, d.cmd.Process.Pid)
		t.Cleanup(func() { _ = d.cmd.Process.Signal(syscall.SIGCONT) })

		start := time.Now()
		got, findings := probe(t, p, k)
		took := time.Since(start)
		want := []string{
			"MountHung@" + stagingRel(staging),
			"MountHung@pods/pod-a/volumes/kubernetes.io~csi/pv-1/mount",
			"MountHung@pods/pod-b/volumes/kubernetes.io~csi/pv-1/mount",
		}
		if strings.Join(got, " ") != strings.Join(sorted(want), " ") {
			t.Fatalf("findings %q (%+v), want %q", got, findings, want)
		}
		// The bound: the child's start, the stat's timeout and the wait for the killed child.
		if bound := nodeprobe.StartTimeout + timeout + 2*time.Second; took > bound {
			t.Errorf("the probe of a frozen mount took %s, more than its start bound, its stat timeout %s and the reaping (%s)", took, timeout, bound)
		}
		// Nothing is left behind: no stat child, no goroutine.
		if left := children(t, d.cmd.Process.Pid); len(left) > 0 {
			t.Errorf("stat children left after the probe: %q", left)
		}
		deadline := time.Now().Add(2 * time.Second)
		for runtime.NumGoroutine() > goroutines && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > goroutines {
			buf := make([]byte, 1<<20)
			t.Errorf("%d goroutines after the probe, %d before:\n%s", n, goroutines, buf[:runtime.Stack(buf, true)])
		}
		// Probing again costs no more: each probe's children are gone at its end.
		probe(t, p, k)
		if left := children(t, d.cmd.Process.Pid); len(left) > 0 {
			t.Errorf("stat children left after a second probe: %q", left)
		}

		if err := d.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if got, findings := probe(t, p, k); len(got) != 0 {
			t.Fatalf("after the daemon continues: %+v", findings)
		}
	})
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// waitStopped waits until every thread of pid is stopped: kill(2) returns before they all are,
// and a thread still running could answer one more request.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		stopped := len(tasks) > 0
		for _, task := range tasks {
			b, err := os.ReadFile(task)
			s := string(b)
			if err != nil || !strings.HasPrefix(strings.TrimSpace(s[strings.LastIndexByte(s, ')')+1:]), "T") {
				stopped = false
				break
			}
		}
		if stopped {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d did not stop within 10s", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRecordsNeverLookIntoAFrozenMount: kubelet's records are read without looking at the mounts
// beside them. A publish folder whose vol_data.json is missing beside a frozen FUSE mount (a
// kubelet stand-in writes none) is reported at once, as an lstat(2) of the mount would wait for
// the frozen mounter, in the sidecar's own goroutine, for as long as it stays frozen.
func TestRecordsNeverLookIntoAFrozenMount(t *testing.T) {
	requireMounts(t, true)
	k := newKubeletDir(t)
	target := filepath.Join(k.dir, "pods", "pod-a", "volumes", "kubernetes.io~csi", "pv-1", "mount")
	if err := os.MkdirAll(target, 0o755); err != nil {
		t.Fatal(err)
	}
	d := startMounter(t, target)
	// The attributes the kernel cached at the mount expire within a second; then every look at
	// the mount asks the frozen mounter.
	if err := d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	done := make(chan error, 1)
	go func() {
		_, err := nodeprobe.Records{KubeletDir: k.dir}.Find(testDriver, "vol-1", "pv-1")
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, nodeprobe.ErrBadRecord) || !strings.Contains(err.Error(), "is missing") {
			t.Fatalf("Find: %v, want %v saying the record is missing beside the mount", err, nodeprobe.ErrBadRecord)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Find did not answer within 5s: it waited for the frozen mounter")
	}
}
