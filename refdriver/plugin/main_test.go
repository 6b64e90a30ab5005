package plugin_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/volume-healer/volume-healer/api/healer/sanity"
	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/refdriver/plugin"
	"github.com/volume-healer/volume-healer/test/harness"
)

// refdriverBin is the refdriver program, built once by TestMain through the test harness when
// this machine can mount; with the race detector when the tests have it.
var refdriverBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		if mountsMissing() != "" {
			return m.Run() // the tests that need mounts skip (or fail, under CI)
		}
		flavor := harness.Plain
		if raceEnabled {
			flavor = harness.Race
		}
		var err error
		if refdriverBin, err = harness.BuildDriver(flavor); err != nil {
			fmt.Fprintf(os.Stderr, "build refdriver: %v\n", err)
			return 1
		}
		return harness.RunUnmountingFuseControl(m)
	}())
}

// mountsMissing says what this machine lacks to mount FUSE file systems, or "".
func mountsMissing() string {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		missing = append(missing, "/dev/fuse")
	}
	return strings.Join(missing, " and ")
}

// requireMounts skips a test that mounts on a machine that cannot, except under CI=true, where
// that is a failure.
func requireMounts(t *testing.T) {
	t.Helper()
	if missing := mountsMissing(); missing != "" {
		msg := "this test mounts FUSE file systems and needs " + missing
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// env is one node: a state folder that outlives plugin restarts, the sockets, and a kubelet
// root under which volumes are staged and published.
type env struct {
	t           *testing.T
	stateDir    string
	sockDir     string
	root        string
	statTimeout time.Duration
	// args are more flags for every run of the plugin, such as --mode stock.
	args []string
}

// newEnv makes a node's folders. Its cleanup, which runs before the folders are removed, kills
// every mounter started for the node and detaches every mount left under its folders.
func newEnv(t *testing.T) *env {
	t.Helper()
	requireMounts(t)
	sockDir, err := os.MkdirTemp("", "rdp") // short: a socket path must fit in 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	e := &env{t: t, stateDir: t.TempDir(), sockDir: sockDir, root: t.TempDir(), statTimeout: time.Second}
	// As kubelet does with its root: bound on itself and recursively shared, so that mounts made
	// under it, repairs included, propagate to every mount namespace that copied it (a pod's,
	// or one another test made meanwhile) unless that namespace made its copy private.
	if err := unix.Mount(e.root, e.root, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind %s on itself: %v", e.root, err)
	}
	t.Cleanup(func() {
		// Every run of the plugin on this node appended to this log.
		b, _ := os.ReadFile(e.logPath())
		switch {
		case bytes.Contains(b, []byte("WARNING: DATA RACE")):
			// The plugin dies by SIGKILL, so the race detector's exit code never shows.
			t.Errorf("the plugin reported a data race:\n%s", b)
		case t.Failed():
			t.Logf("plugin log:\n%s", b)
		}
	})
	t.Cleanup(func() {
		for _, pid := range mountersOf(e.stateDir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		for _, dir := range []string{e.root, e.stateDir} {
			detachAll(t, dir)
		}
	})
	if err := unix.Mount("", e.root, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		t.Fatalf("make %s shared: %v", e.root, err)
	}
	return e
}

func (e *env) logPath() string {
	return filepath.Join(e.stateDir, "plugin.log")
}

func (e *env) stagingPath(name string) string {
	return filepath.Join(e.root, "plugins", "kubernetes.io", "csi", "healer.example.com", name, "globalmount")
}

func (e *env) targetPath(pod, name string) string {
	return filepath.Join(e.root, "pods", pod, "volumes", "kubernetes.io~csi", name, "mount")
}

// proc is one run of the plugin, in a process group of its own, as a node plugin container.
type proc struct {
	t          *testing.T
	cmd        *exec.Cmd
	done       chan struct{}
	identity   csi.IdentityClient
	controller csi.ControllerClient
	node       csi.NodeClient
	healer     healerv1alpha1.HealerClient
	control    *sanity.HTTPControl
	http       *http.Client
	stateDir   string

	addonsEndpoint, csiEndpoint, controlEndpoint string
}

// start runs the plugin on the node's state folder and waits until it answers.
func (e *env) start() *proc {
	e.t.Helper()
	return e.startAs("", "")
}

// startAs runs a plugin on the node's state folder with sockets of its own, named after name
// (the ones start uses when name is ""), playing nodeID (the plugin's default when ""), and
// waits until it answers. Several may run at once, as a controller plugin and a node plugin
// share one state folder.
func (e *env) startAs(name, nodeID string) *proc {
	t := e.t
	t.Helper()
	p := &proc{
		t:               t,
		done:            make(chan struct{}),
		stateDir:        e.stateDir,
		addonsEndpoint:  "unix://" + filepath.Join(e.sockDir, name+"addons.sock"),
		csiEndpoint:     "unix://" + filepath.Join(e.sockDir, name+"csi.sock"),
		controlEndpoint: "unix://" + filepath.Join(e.sockDir, name+"control.sock"),
	}
	logFile, err := os.OpenFile(e.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = logFile.Close() }()
	args := []string{"--endpoint", p.addonsEndpoint, "--csi-endpoint", p.csiEndpoint, "--control", p.controlEndpoint,
		"--state-dir", e.stateDir, "--stat-timeout", e.statTimeout.String(), "--v", "2"}
	if nodeID != "" {
		args = append(args, "--node-id", nodeID)
	}
	args = append(args, e.args...)
	p.cmd = exec.Command(refdriverBin, args...)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	// Its own group: killing the group kills the plugin and its mounters, as a container dies.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.killGroup)

	dial := func(endpoint string) *grpc.ClientConn {
		// Retry the socket quickly: the restart measurements must not include a second of
		// gRPC's default reconnect backoff.
		conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 200 * time.Millisecond}}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	csiConn, addonsConn := dial(p.csiEndpoint), dial(p.addonsEndpoint)
	p.identity, p.controller, p.node = csi.NewIdentityClient(csiConn), csi.NewControllerClient(csiConn), csi.NewNodeClient(csiConn)
	p.healer = healerv1alpha1.NewHealerClient(addonsConn)
	if p.control, err = sanity.NewHTTPControl(p.controlEndpoint); err != nil {
		t.Fatal(err)
	}
	ctlPath, _ := control.ParseEndpoint(p.controlEndpoint)
	p.http = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", ctlPath)
		},
	}}

	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := p.identity.Probe(ctx, &csi.ProbeRequest{})
		cancel()
		if err == nil {
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("the plugin exited before it answered: %v", p.cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the plugin did not answer within 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// killGroup kills the plugin's process group, mounters included, and waits for the plugin.
func (p *proc) killGroup() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	// The mounters are not the test's children: wait until they are gone from /proc, after
	// which their mounts answer ENOTCONN (a call that was in flight got ECONNABORTED).
	deadline := time.Now().Add(10 * time.Second)
	for len(mountersOf(p.stateDir)) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

var mountCapability = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// volume is one volume created, staged and published as kubelet does it.
type volume struct {
	id, staging, target string
	context             map[string]string
	stageTook           time.Duration
}

// createStagePublish creates a volume and stages and publishes it at the node's kubelet paths.
func (p *proc) createStagePublish(e *env, name string) *volume {
	t := p.t
	t.Helper()
	created, err := p.controller.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{mountCapability}})
	if err != nil {
		t.Fatalf("CreateVolume(%s): %v", name, err)
	}
	v := &volume{id: created.GetVolume().GetVolumeId(), context: created.GetVolume().GetVolumeContext(),
		staging: e.stagingPath(name), target: e.targetPath("pod-"+name, name)}
	if err := os.MkdirAll(v.staging, 0o750); err != nil { // kubelet makes the staging folder
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := p.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{
		VolumeId: v.id, StagingTargetPath: v.staging, VolumeCapability: mountCapability, VolumeContext: v.context,
	}); err != nil {
		t.Fatalf("NodeStageVolume(%s): %v", v.id, err)
	}
	v.stageTook = time.Since(start)
	if err := os.MkdirAll(filepath.Dir(v.target), 0o750); err != nil { // kubelet makes the parent
		t.Fatal(err)
	}
	if _, err := p.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{
		VolumeId: v.id, StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: mountCapability, VolumeContext: v.context,
	}); err != nil {
		t.Fatalf("NodePublishVolume(%s): %v", v.id, err)
	}
	return v
}

// teardown unpublishes, unstages and deletes the volume as kubelet and the provisioner do.
func (p *proc) teardown(v *volume) {
	t := p.t
	t.Helper()
	if _, err := p.node.NodeUnpublishVolume(ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target}); err != nil {
		t.Errorf("NodeUnpublishVolume(%s): %v", v.id, err)
	}
	if _, err := p.node.NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging}); err != nil {
		t.Errorf("NodeUnstageVolume(%s): %v", v.id, err)
	}
	if _, err := p.controller.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: v.id}); err != nil {
		t.Errorf("DeleteVolume(%s): %v", v.id, err)
	}
}

// status reads the control interface's view of a volume, with what only real mounts have.
func (p *proc) status(id string) plugin.VolumeStatus {
	t := p.t
	t.Helper()
	req, err := http.NewRequestWithContext(ctx(t), http.MethodGet, "http://refdriver/volumes/"+url.PathEscape(id), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := p.http.Do(req)
	if err != nil {
		t.Fatalf("GET volume %s: %v", id, err)
	}
	defer func() { _ = resp.Body.Close() }()
	var vs plugin.VolumeStatus
	if resp.StatusCode != http.StatusOK {
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		t.Fatalf("GET volume %s: HTTP %d: %s", id, resp.StatusCode, b.String())
	}
	if err := json.NewDecoder(resp.Body).Decode(&vs); err != nil {
		t.Fatal(err)
	}
	return vs
}

// writeRead writes a file through dir and reads it back.
func writeRead(dir, name, content string) error {
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		return err
	}
	got, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if string(got) != content {
		return fmt.Errorf("read %q back from %s, wrote %q", got, path, content)
	}
	return nil
}

// mountPoints lists the mount points under dir in this process's mount table, deepest last.
func mountPoints(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountInfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// unescapeMountInfo undoes the octal escapes (\040 for a space) of mountinfo fields.
func unescapeMountInfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// detachAll lazily detaches every mount under dir, deepest first, every stacked layer.
func detachAll(t *testing.T, dir string) {
	t.Helper()
	for range 64 {
		mps := mountPoints(t, dir)
		if len(mps) == 0 {
			return
		}
		slices.SortFunc(mps, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
		for _, mp := range mps {
			_ = unix.Unmount(mp, unix.MNT_DETACH)
		}
	}
	t.Errorf("mounts stay under %s: %v", dir, mountPoints(t, dir))
}

// mountersOf lists the live mounter processes serving volumes of the state folder: the
// plugin's own mounters and rclone's.
func mountersOf(stateDir string) []int {
	return harness.ProcessesWhere(func(pid int) bool {
		args := harness.CommandLine(pid)
		if len(args) > 2 && filepath.Base(args[0]) == "rclone" && args[1] == "mount" && strings.HasPrefix(args[2], stateDir+"/") {
			return true
		}
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "--source" && strings.HasPrefix(args[i+1], stateDir+"/") && slices.Contains(args, "mounter") {
				return true
			}
		}
		return false
	})
}

// requireRclone skips a test that runs rclone mount on a machine without rclone or fusermount,
// except under CI=true, where that is a failure: hack/fuse.sh installs both.
func requireRclone(t *testing.T) {
	t.Helper()
	var missing []string
	for _, program := range []string{"rclone", "fusermount"} {
		if _, err := exec.LookPath(program); err != nil {
			missing = append(missing, program)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := "this test mounts volumes with rclone and needs " + strings.Join(missing, " and ") + " on the PATH (hack/fuse.sh installs them)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// expectNothingLeft checks that no mount is left under the node's folders and that no mounter
// of its volumes still runs.
func (e *env) expectNothingLeft() {
	t := e.t
	t.Helper()
	for _, dir := range []string{e.root, e.stateDir} {
		mps := slices.DeleteFunc(mountPoints(t, dir), func(mp string) bool { return mp == e.root })
		if len(mps) > 0 {
			t.Errorf("mounts left under %s: %v", dir, mps)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(mountersOf(e.stateDir)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if pids := mountersOf(e.stateDir); len(pids) > 0 {
		t.Errorf("mounter processes left: %v", pids)
	}
}
