package nodeprobe_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/sidecar/nodeprobe"
)

// The reference driver in stock mode is a driver that serves no Healer service: the sidecar
// probes its volumes itself. These tests run it as a process of its own, with its own mounter
// and with rclone's, and probe what it leaves on the node.

var (
	refdriverOnce sync.Once
	refdriverPath string
	refdriverErr  error
)

// buildRefdriver builds cmd/refdriver once per test binary.
func buildRefdriver(t *testing.T) string {
	t.Helper()
	refdriverOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nodeprobe-refdriver")
		if err != nil {
			refdriverErr = err
			return
		}
		refdriverPath = filepath.Join(dir, "refdriver")
		cmd := exec.Command("go", "build", "-o", refdriverPath, "./cmd/refdriver")
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			refdriverErr = fmt.Errorf("go build ./cmd/refdriver: %w\n%s", err, out)
		}
	})
	if refdriverErr != nil {
		t.Fatal(refdriverErr)
	}
	return refdriverPath
}

// stockDriver is the reference driver in stock mode, run in a process group of its own, as a
// node plugin container, on a state folder that outlives its restarts.
type stockDriver struct {
	t        *testing.T
	bin      string
	stateDir string
	sockDir  string
	mounter  string
	cmd      *exec.Cmd
	done     chan struct{}
	node     csi.NodeClient
	ctrl     csi.ControllerClient
}

func newStockDriver(t *testing.T, mounter string) *stockDriver {
	t.Helper()
	sockDir, err := os.MkdirTemp("/tmp", "npsd") // short: a socket path must fit in 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	d := &stockDriver{t: t, bin: buildRefdriver(t), stateDir: t.TempDir(), sockDir: sockDir, mounter: mounter}
	t.Cleanup(func() {
		d.kill()
		// The dead mounts a killed driver leaves are the test's to remove.
		detachUnder(t, d.stateDir)
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(d.stateDir, "driver.log"))
			t.Logf("the stock driver's log:\n%s", b)
		}
	})
	return d
}

// start runs the driver with more flags and waits until its CSI socket answers.
func (d *stockDriver) start(more ...string) {
	t := d.t
	t.Helper()
	csiEndpoint := "unix://" + filepath.Join(d.sockDir, "csi.sock")
	args := append([]string{"--mode", "stock", "--mounter", d.mounter, "--driver-name", testDriver,
		"--endpoint", "unix://" + filepath.Join(d.sockDir, "addons.sock"), "--csi-endpoint", csiEndpoint,
		"--state-dir", d.stateDir, "--stat-timeout", "2s"}, more...)
	d.cmd = exec.Command(d.bin, args...)
	log, err := os.OpenFile(filepath.Join(d.stateDir, "driver.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = log.Close() }()
	d.cmd.Stdout, d.cmd.Stderr = log, log
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(d.cmd, d.done)
	conn, err := grpc.NewClient(csiEndpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	d.node, d.ctrl = csi.NewNodeClient(conn), csi.NewControllerClient(conn)
	ids := csi.NewIdentityClient(conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := ids.Probe(ctx, &csi.ProbeRequest{})
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stock driver did not answer within 30s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill kills the driver's process group, its mounters with it, as a container dies, and waits
// until the whole group is gone: only then do the mounts answer ENOTCONN.
func (d *stockDriver) kill() {
	if d.cmd == nil {
		return
	}
	group := d.cmd.Process.Pid
	_ = syscall.Kill(-group, syscall.SIGKILL)
	<-d.done
	d.cmd = nil
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(-group, 0) == nil {
		if time.Now().After(deadline) {
			d.t.Error("the stock driver's mounters outlived the kill of its process group")
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (d *stockDriver) call(f func(ctx context.Context) error) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f(ctx); err != nil {
		d.t.Fatal(err)
	}
}

// detachUnder lazily detaches every mount below dir, every layer.
func detachUnder(t *testing.T, dir string) {
	for range 64 {
		var left []string
		for _, line := range strings.Split(readMountInfo(t), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
				left = append(left, f[4])
			}
		}
		if len(left) == 0 {
			return
		}
		for _, mp := range left {
			_ = unix.Unmount(mp, unix.MNT_DETACH)
		}
	}
}

func readMountInfo(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestProbeOfAStockDriver: the probe finds what a stock driver leaves behind when its node
// plugin dies with its mounters: dead mounts at the staging path and the pod's target; after a
// restart whose clean-up unmounted the target, a target that is no longer a mount at all; after
// a replacement pod's NodePublishVolume (which mounts the staging path again), the first pod's
// target alone.
func TestProbeOfAStockDriver(t *testing.T) {
	for _, mounter := range []string{"refdriver", "rclone"} {
		t.Run(mounter, func(t *testing.T) {
			requireMounts(t, true)
			if mounter == "rclone" {
				requireRclone(t)
			}
			d := newStockDriver(t, mounter)
			d.start()
			k := newKubeletDir(t)
			t.Cleanup(func() { detachUnder(t, k.dir) })
			var id string
			d.call(func(ctx context.Context) error {
				resp, err := d.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pv-1", VolumeCapabilities: []*csi.VolumeCapability{fsCapability}})
				id = resp.GetVolume().GetVolumeId()
				return err
			})
			staging := k.stage(testDriver, id, "pv-1")
			targetA := k.publish("pod-a", testDriver, id, "pv-1")
			d.call(func(ctx context.Context) error {
				_, err := d.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: fsCapability})
				return err
			})
			publish := func(target string) {
				t.Helper()
				d.call(func(ctx context.Context) error {
					_, err := d.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: fsCapability})
					return err
				})
			}
			publish(targetA)
			p := nodeprobe.New(nodeprobe.Options{KubeletDir: k.dir, Stat: nodeprobe.StatterOptions{Timeout: 5 * time.Second}})
			probeIs := func(when string, want ...string) {
				t.Helper()
				_, findings, err := p.Probe(context.Background(), nodeprobe.Request{Driver: testDriver, Handle: id, PV: "pv-1"})
				if err != nil {
					t.Fatalf("%s: Probe: %v", when, err)
				}
				if got := reasons(k.dir, findings); strings.Join(got, " ") != strings.Join(sorted(want), " ") {
					t.Fatalf("%s: findings %q (%+v), want %q", when, got, findings, sorted(want))
				}
			}
			stagingAt := "plugins/kubernetes.io/csi/" + testDriver + "/" + filepath.Base(filepath.Dir(staging)) + "/globalmount"
			podA := "pods/pod-a/volumes/kubernetes.io~csi/pv-1/mount"
			probeIs("staged and published")

			d.kill()
			probeIs("the driver died with its mounters", "MountDisconnected@"+stagingAt, "MountDisconnected@"+podA)

			d.start("--unmount-dead-targets-on-start")
			probeIs("restarted with the start-up clean-up", "MountDisconnected@"+stagingAt, healerv1alpha1.ReasonPublishTargetNotMounted+"@"+podA)

			targetB := k.publish("pod-b", testDriver, id, "pv-1")
			publish(targetB)
			probeIs("a replacement pod got NodePublishVolume", healerv1alpha1.ReasonPublishTargetNotMounted+"@"+podA)
			if err := os.WriteFile(filepath.Join(targetB, "written"), []byte("by the replacement pod"), 0o644); err != nil {
				t.Fatalf("the replacement pod cannot write: %v", err)
			}
			if got, err := os.ReadFile(filepath.Join(d.stateDir, "volumes", id, "written")); err != nil || string(got) != "by the replacement pod" {
				t.Fatalf("the replacement pod's write is not in the volume: %q, %v", got, err)
			}
		})
	}
}

var fsCapability = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// requireRclone skips a test that runs rclone mount where rclone or fusermount is missing,
// except under CI=true, where hack/fuse.sh has installed them and a lack is a failure.
func requireRclone(t *testing.T) {
	t.Helper()
	for _, program := range []string{"rclone", "fusermount"} {
		if _, err := exec.LookPath(program); err != nil {
			msg := "this test mounts with rclone and needs " + program + " (hack/fuse.sh installs it)"
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}
