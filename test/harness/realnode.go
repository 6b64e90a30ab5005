package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/sidecar/nodeprobe"
	"github.com/volume-healer/volume-healer/test/kubelet"
)

// RealNodeOptions describe a node whose volumes are really mounted.
type RealNodeOptions struct {
	// Node is the node's name. Required.
	Node string
	// Driver is the CSI driver's name. Required.
	Driver string
	// Namespace holds the node's CSIAddonsNode. Required.
	Namespace string
	// Kube is the sidecar's client configuration. Required.
	Kube *rest.Config
	// Dir holds the kubelet root, the driver's state and logs. Required.
	Dir string
	// DriverBinary is cmd/refdriver (Build with NodePlugin). Required.
	DriverBinary string
	// WorkloadBinary is test/workload (BuildWorkload); needed by StartWorkload only.
	WorkloadBinary string
	// StatTimeout is the driver's deadline for a stat of a mount: longer, the mount counts as
	// hung. Default: 1s.
	StatTimeout time.Duration
	// KeepPort keeps the sidecar's port from start to start, as PluginOptions.KeepPort does.
	KeepPort bool
	// RegisterTimeout bounds how long Start waits for the sidecar to register. Default: 2m.
	RegisterTimeout time.Duration
	// Logger, when set, is the sidecar's logger; else klog's global one.
	Logger *klog.Logger
	// Stock makes the driver look like a stock CSI driver to the sidecar: the sidecar reaches it
	// through a relay that serves its CSI-Addons Identity service alone, so every Healer call
	// answers UNIMPLEMENTED and the sidecar probes the volumes itself (tier "none"). Mount then
	// writes kubelet's records (vol_data.json), which that probe reads, and Unpublish and Unstage
	// remove them, as kubelet does. Default false.
	Stock bool
	// SidecarBinary is cmd/healer-sidecar (Build with NodePlugin), which the sidecar starts to stat
	// a mount when it probes a volume itself: required with Stock, since this process is not
	// that program.
	SidecarBinary string
}

// RealNode is one node with real mounts on this machine: a kubelet stand-in (test/kubelet) under
// Dir, the reference driver in its real mode as a process that leads its own process group (its
// FUSE mounters run in that group, as a node plugin container's do), and the healer sidecar in
// this process in front of it. Each Start is a start of the node plugin pod; Kill is its death,
// the driver's whole process group killed at once, which leaves every mount it served answering
// ENOTCONN.
type RealNode struct {
	opts     RealNodeOptions
	kubelet  *kubelet.Kubelet
	procs    *Processes
	stateDir string
	sockDir  string
	socket   string
	control  string

	mu        sync.Mutex
	addr      string
	starts    int
	drv       *Process
	sc        *Sidecar
	relay     *stockRelay
	workloads []*kubelet.Workload
}

// NewRealNode prepares the node: its kubelet root is made (a shared bind mount, as kubelet makes
// it); nothing runs yet.
func NewRealNode(o RealNodeOptions) (*RealNode, error) {
	if o.Node == "" || o.Driver == "" || o.Namespace == "" || o.Kube == nil || o.Dir == "" || o.DriverBinary == "" {
		return nil, errors.New("real node: Node, Driver, Namespace, Kube, Dir and DriverBinary are required")
	}
	if o.Stock && o.SidecarBinary == "" {
		return nil, errors.New("real node: a Stock node needs SidecarBinary, which its sidecar starts to stat a mount")
	}
	if o.StatTimeout == 0 {
		o.StatTimeout = time.Second
	}
	if o.RegisterTimeout == 0 {
		o.RegisterTimeout = 2 * time.Minute
	}
	n := &RealNode{opts: o, procs: NewProcesses(), stateDir: filepath.Join(o.Dir, "driver")}
	if err := os.MkdirAll(n.stateDir, 0o755); err != nil {
		return nil, err
	}
	// UNIX socket paths must stay short: they live in a folder of their own under /tmp.
	dir, err := os.MkdirTemp("", "vh-node")
	if err != nil {
		return nil, err
	}
	n.sockDir, n.socket, n.control = dir, filepath.Join(dir, "csi.sock"), filepath.Join(dir, "control.sock")
	if n.kubelet, err = kubelet.New(filepath.Join(o.Dir, "kubelet")); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if o.KeepPort {
		if n.addr, err = FreeAddr(); err != nil {
			return nil, errors.Join(err, n.kubelet.Close(), os.RemoveAll(dir))
		}
	}
	return n, nil
}

// Node is the node's name.
func (n *RealNode) Node() string { return n.opts.Node }

// Kubelet is the node's kubelet stand-in.
func (n *RealNode) Kubelet() *kubelet.Kubelet { return n.kubelet }

// Control reaches the driver's control socket (the current start's: the client dials per call).
func (n *RealNode) Control() *simulated.ControlClient {
	c, err := simulated.NewControlClient("unix://" + n.control)
	if err != nil {
		// The endpoint is built here and always valid.
		panic(err)
	}
	return c
}

// DriverLog is the file the driver's output goes to, every start appended.
func (n *RealNode) DriverLog() string { return filepath.Join(n.opts.Dir, "refdriver.log") }

// Start starts the node plugin pod: the driver, then the sidecar, and returns once the sidecar has
// registered its CSIAddonsNode (a new restart marker).
func (n *RealNode) Start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.drv != nil {
		return fmt.Errorf("the node plugin on %s started twice", n.opts.Node)
	}
	for _, s := range []string{n.socket, n.control} {
		if err := os.Remove(s); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	drv, err := n.procs.Start("refdriver-"+n.opts.Node, n.opts.DriverBinary, []string{
		"--mode=real", "--endpoint=unix://" + n.socket, "--control=unix://" + n.control,
		"--state-dir=" + n.stateDir, "--driver-name=" + n.opts.Driver, "--node-id=" + n.opts.Node,
		"--stat-timeout=" + n.opts.StatTimeout.String(),
	}, nil, n.DriverLog())
	if err != nil {
		return err
	}
	if err := n.waitSocket(ctx, drv); err != nil {
		_ = drv.KillGroup()
		return err
	}
	n.starts++
	runCtx := context.WithoutCancel(ctx)
	if n.opts.Logger != nil {
		runCtx = klog.NewContext(runCtx, *n.opts.Logger)
	}
	addr := n.addr
	if !n.opts.KeepPort {
		addr = "127.0.0.1:0"
	}
	endpoint := n.socket
	var statCommand []string
	if n.opts.Stock {
		statCommand = []string{n.opts.SidecarBinary, nodeprobe.StatArg}
		relay, err := startStockRelay(n.socket, filepath.Join(n.sockDir, "addons.sock"))
		if err != nil {
			_ = drv.KillGroup()
			return err
		}
		n.relay, endpoint = relay, relay.path
	}
	sc, err := StartSidecar(runCtx, sidecar.Options{
		KubeConfig:     n.opts.Kube,
		NodeName:       n.opts.Node,
		Namespace:      n.opts.Namespace,
		PodUID:         fmt.Sprintf("%s-real-start-%d", n.opts.Node, n.starts),
		DriverEndpoint: "unix://" + endpoint,
		StatCommand:    statCommand,
		StatTimeout:    n.opts.StatTimeout,
		KubeletDir:     n.kubelet.Root(),
		ListenAddress:  addr,
		Insecure:       true,
		MetricsAddress: "0",
	})
	if err != nil {
		_ = drv.KillGroup()
		return err
	}
	n.drv, n.sc = drv, sc
	select {
	case <-sc.Registered():
		return nil
	case <-sc.Done():
		return fmt.Errorf("the sidecar on %s stopped before it registered its CSIAddonsNode: %v", n.opts.Node, sc.Err())
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(n.opts.RegisterTimeout):
		return fmt.Errorf("the sidecar on %s did not register its CSIAddonsNode within %s", n.opts.Node, n.opts.RegisterTimeout)
	}
}

// waitSocket waits until the driver serves its socket, or fails with its log when it exits.
func (n *RealNode) waitSocket(ctx context.Context, drv *Process) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(n.socket); err == nil {
			if _, err := os.Stat(n.control); err == nil {
				return nil
			}
		}
		select {
		case <-drv.Exited():
			return fmt.Errorf("the driver on %s exited at start (%s): %s", n.opts.Node, drv.ExitStatus(), drv.LogTail(20))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the driver on %s did not serve %s within 30s: %s", n.opts.Node, n.socket, drv.LogTail(20))
		}
	}
}

// Kill ends the node plugin pod as an OOM kill or a node plugin crash does: the driver's process
// group (the driver and every mounter) gets SIGKILL, and the sidecar stops.
func (n *RealNode) Kill() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.killLocked()
}

func (n *RealNode) killLocked() error {
	var errs []error
	if n.drv != nil {
		errs = append(errs, n.drv.KillGroup())
	}
	if n.sc != nil {
		if err := n.sc.Stop(10 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("sidecar on %s: %w", n.opts.Node, err))
		}
	}
	if n.relay != nil {
		n.relay.stop()
	}
	n.drv, n.sc, n.relay = nil, nil, nil
	return errors.Join(errs...)
}

// Running tells whether the driver process runs.
func (n *RealNode) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.drv != nil && n.drv.Running()
}

// dial connects to the driver's CSI socket (the current start's).
func (n *RealNode) dial(ctx context.Context) (*grpc.ClientConn, error) {
	return kubelet.Dial(ctx, "unix://"+n.socket)
}

// Provision creates the volume with the driver's CreateVolume, as the external-provisioner does,
// and sets v.Handle to the volume ID the driver gives it, before the PV is created.
func (n *RealNode) Provision(ctx context.Context, v *Volume) error {
	conn, err := n.dial(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	resp, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:          v.PV,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
		Parameters: map[string]string{"mounter": v.Mounter},
	})
	if err != nil {
		return fmt.Errorf("CreateVolume %s on %s: %w", v.PV, n.opts.Node, err)
	}
	v.Handle = resp.GetVolume().GetVolumeId()
	return nil
}

// kubeletVolume is the volume as the kubelet stand-in stages and publishes it.
func (n *RealNode) kubeletVolume(v *Volume) kubelet.Volume {
	return kubelet.Volume{DriverName: n.opts.Driver, Handle: v.Handle, PVName: v.PV, VolumeContext: v.Attributes()}
}

// Mount stages the volume and publishes it for the pod podUID, as kubelet does when the pod
// starts, and returns the publish path.
func (n *RealNode) Mount(ctx context.Context, v *Volume, podUID string) (string, error) {
	conn, err := n.dial(ctx)
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	kv := n.kubeletVolume(v)
	staging := n.StagingPath(v)
	if err := n.volData(filepath.Dir(staging), map[string]string{"driverName": n.opts.Driver, "volumeHandle": v.Handle}); err != nil {
		return "", err
	}
	if err := n.kubelet.Stage(ctx, conn, kv); err != nil {
		return "", fmt.Errorf("stage %s on %s: %w", v.PV, n.opts.Node, err)
	}
	if err := n.volData(filepath.Dir(n.kubelet.PublishPath(podUID, v.PV)), map[string]string{"driverName": n.opts.Driver,
		"volumeHandle": v.Handle, "specVolID": v.PV, "volumeLifecycleMode": "Persistent"}); err != nil {
		return "", err
	}
	target, err := n.kubelet.Publish(ctx, conn, kv, podUID)
	if err != nil {
		return "", fmt.Errorf("publish %s on %s: %w", v.PV, n.opts.Node, err)
	}
	return target, nil
}

// volData writes kubelet's vol_data.json into dir, for a Stock node only: kubelet writes it before
// NodeStageVolume or NodePublishVolume.
func (n *RealNode) volData(dir string, data map[string]string) error {
	if !n.opts.Stock {
		return nil
	}
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "vol_data.json"), b, 0o600)
}

// Unpublish unpublishes the volume from the pod podUID, as kubelet does once the pod is gone; on
// a Stock node kubelet's record goes first.
func (n *RealNode) Unpublish(ctx context.Context, v *Volume, podUID string) error {
	conn, err := n.dial(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	if n.opts.Stock {
		if err := os.Remove(filepath.Join(filepath.Dir(n.kubelet.PublishPath(podUID, v.PV)), "vol_data.json")); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := n.kubelet.Unpublish(ctx, conn, n.kubeletVolume(v), podUID); err != nil {
		return fmt.Errorf("unpublish %s from pod %s on %s: %w", v.PV, podUID, n.opts.Node, err)
	}
	return nil
}

// Unstage unstages the volume, as kubelet does once no pod on the node uses it; on a Stock node
// kubelet's record goes first.
func (n *RealNode) Unstage(ctx context.Context, v *Volume) error {
	conn, err := n.dial(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	if n.opts.Stock {
		if err := os.Remove(filepath.Join(filepath.Dir(n.StagingPath(v)), "vol_data.json")); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := n.kubelet.Unstage(ctx, conn, n.kubeletVolume(v)); err != nil {
		return fmt.Errorf("unstage %s on %s: %w", v.PV, n.opts.Node, err)
	}
	return nil
}

// StagingPath is where kubelet stages the volume on this node.
func (n *RealNode) StagingPath(v *Volume) string {
	return n.kubelet.StagingPath(n.opts.Driver, v.Handle)
}

// StartWorkload starts a workload stand-in that does I/O on the publish target through a mount
// of the given propagation (HostToContainer or None) in its own mount namespace.
func (n *RealNode) StartWorkload(ctx context.Context, name, target string, propagation corev1.MountPropagationMode) (*kubelet.Workload, error) {
	if n.opts.WorkloadBinary == "" {
		return nil, errors.New("real node: WorkloadBinary is required for workloads")
	}
	w, err := kubelet.StartWorkload(ctx, kubelet.WorkloadOptions{
		Bin: n.opts.WorkloadBinary, Target: target, Propagation: propagation, Name: name,
		Dir: filepath.Join(n.opts.Dir, "workloads", name),
	})
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.workloads = append(n.workloads, w)
	n.mu.Unlock()
	return w, nil
}

// Close stops the workloads and the node plugin, unmounts everything under the kubelet root and
// checks that no mount and no process of the node is left.
func (n *RealNode) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []error
	for _, w := range n.workloads {
		errs = append(errs, w.Stop())
	}
	n.workloads = nil
	errs = append(errs, n.killLocked())
	// A mounter started by a driver that was killed alone is not in a group anyone kills.
	errs = append(errs, KillProcessesUnder(n.opts.Dir))
	errs = append(errs, n.kubelet.Close(), os.RemoveAll(n.sockDir))
	errs = append(errs, Leftovers(n.opts.Dir))
	return errors.Join(errs...)
}

// Leftovers fails when a mount point or a process's command line lies under dir: what a suite
// must not leave behind.
func Leftovers(dir string) error {
	var problems []string
	mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) { return !underDir(m.Mountpoint, dir), false })
	if err != nil {
		return err
	}
	for _, m := range mounts {
		problems = append(problems, "mount at "+m.Mountpoint)
	}
	for _, pid := range ProcessesUnder(dir) {
		problems = append(problems, fmt.Sprintf("process %d (%s)", pid, cmdline(pid)))
	}
	if len(problems) > 0 {
		return fmt.Errorf("left behind under %s: %s", dir, strings.Join(problems, "; "))
	}
	return nil
}

func underDir(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

// ProcessesUnder lists the processes (other than this one) whose command line names a path under
// dir: the driver, its mounters and the workloads of a node; every component of a test/cluster node.
func ProcessesUnder(dir string) []int {
	return ProcessesWhere(func(pid int) bool {
		if pid == os.Getpid() {
			return false
		}
		for _, a := range strings.Fields(cmdline(pid)) {
			if i := strings.IndexByte(a, '='); i >= 0 {
				a = a[i+1:]
			}
			if underDir(a, dir) {
				return true
			}
		}
		return false
	})
}

// cmdline is the command line of process pid as a shell shows it; "" once the process has ended.
func cmdline(pid int) string { return strings.Join(CommandLine(pid), " ") }

// KillProcessesUnder kills what ProcessesUnder finds and waits for it to go.
func KillProcessesUnder(dir string) error {
	pids := ProcessesUnder(dir)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return WaitFor(context.Background(), 10*time.Second, "the processes under "+dir+" to end after SIGKILL", func() (bool, string) {
		left := ProcessesUnder(dir)
		return len(left) == 0, fmt.Sprintf("%v still run", left)
	})
}

// RealMountsUnavailable says why this machine cannot run real mounts ("" when it can): they need
// root and /dev/fuse.
func RealMountsUnavailable() string {
	if os.Geteuid() != 0 {
		return "real mounts need root"
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return "real mounts need /dev/fuse: " + err.Error()
	}
	return ""
}

// RequireRealMounts skips the test on a machine without root or /dev/fuse, except in CI (CI=true),
// where the machine has both and a missing one fails the test instead of hiding it.
func RequireRealMounts(t testing.TB) {
	t.Helper()
	why := RealMountsUnavailable()
	switch {
	case why == "":
	case os.Getenv("CI") == "true":
		t.Fatalf("%s, and CI (CI=true) must run the real-mount tests", why)
	default:
		t.Skip(why)
	}
}

// StartRealNode creates the Node object o.Node and starts a real node for the fixture's driver
// and plugin namespace: the workload stand-in built when o.WorkloadBinary is empty, the node's
// folder under the test's, and Close run when the test ends, a leftover mount or process failing
// the test (with the end of the driver's log when it failed). o's Node, Kube and DriverBinary are
// the caller's; Driver, Namespace and Dir are set here.
func (f *Fixture) StartRealNode(o RealNodeOptions) *RealNode {
	f.T.Helper()
	if o.WorkloadBinary == "" {
		bin, err := BuildWorkload()
		if err != nil {
			f.T.Fatalf("%v", err)
		}
		o.WorkloadBinary = bin
	}
	o.Driver, o.Namespace = f.Driver, f.PluginNS
	dir, err := os.MkdirTemp("", "vh-real")
	if err != nil {
		f.T.Fatalf("%v", err)
	}
	o.Dir = dir
	f.CreateNode(o.Node)
	n, err := NewRealNode(o)
	if err != nil {
		_ = os.RemoveAll(dir)
		f.T.Fatalf("%v", err)
	}
	f.T.Cleanup(func() {
		if err := n.Close(); err != nil {
			f.T.Errorf("node %s: %v", o.Node, err)
		} else {
			_ = os.RemoveAll(dir)
		}
		if f.T.Failed() {
			f.T.Logf("driver log:\n%s", FileTail(n.DriverLog(), 60))
		}
	})
	if err := n.Start(f.Ctx()); err != nil {
		f.T.Fatalf("%v", err)
	}
	return n
}

// ProvisionAll creates each volume with the node's driver (Provision) and then its API objects
// (Fixture.CreateVolumes, claims bound).
func (f *Fixture) ProvisionAll(n *RealNode, vols []*Volume) {
	f.T.Helper()
	for _, v := range vols {
		if err := n.Provision(f.Ctx(), v); err != nil {
			f.T.Fatalf("%v", err)
		}
	}
	f.CreateVolumes(vols, true)
}
