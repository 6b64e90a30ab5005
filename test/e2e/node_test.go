package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/test/harness"
)

// processGrace is how long a sidecar or driver may take to stop after SIGTERM.
const processGrace = 15 * time.Second

// node is one simulated node: a CSI node plugin pod with the reference driver serving its
// CSI-Addons socket and the healer sidecar in front of it, each its own process. Restarting the
// plugin starts new processes: a driver reading its volumes from its state folder, a sidecar with a
// new pod UID, which writes a new restart marker on the CSIAddonsNode.
type node struct {
	f        *fixture
	name     string
	stateDir string
	sockDir  string
	logDir   string
	control  *simulated.ControlClient
	// volumes are added to the driver at each start if it does not know them yet.
	volumes []*volume
	// sidecarArgs are more flags for the sidecar; with --tls-cert-file it serves TLS, else it
	// runs with --insecure.
	sidecarArgs []string
	// pod, when set, gives the pod UID of the next sidecar start (that of a Pod object); else
	// each start makes one up.
	pod func() string

	mu      sync.Mutex
	driver  *harness.Process
	sidecar *harness.Process
	starts  int
	podUID  string
	// startedAt is when the current sidecar was started: its restart marker is later.
	startedAt time.Time
	// pastCalls and pastCounters hold what the drivers of earlier starts served, read just before
	// each was stopped.
	pastCalls    []control.Call
	pastCounters []control.Counters
}

// newNode creates the Node object and a node whose plugin has not started yet.
func (f *fixture) newNode(name string) *node {
	f.t.Helper()
	f.CreateNode(name)
	// UNIX socket paths must stay under 108 bytes, which test folders can exceed.
	sockDir, err := os.MkdirTemp("", "vh")
	if err != nil {
		f.t.Fatal(err)
	}
	control, err := simulated.NewControlClient("unix://" + filepath.Join(sockDir, "control.sock"))
	if err != nil {
		f.t.Fatal(err)
	}
	n := &node{
		f: f, name: name,
		stateDir: filepath.Join(f.t.TempDir(), name),
		sockDir:  sockDir,
		logDir:   f.s.LogDir(f.t),
		control:  control,
	}
	f.t.Cleanup(func() {
		if err := n.stop(); err != nil {
			f.t.Errorf("stop node %s: %v", name, err)
		}
		_ = os.RemoveAll(sockDir)
	})
	return n
}

func (n *node) endpoint() string { return "unix://" + filepath.Join(n.sockDir, "csi-addons.sock") }

// start starts the driver, then the sidecar, and returns once the sidecar has written its restart
// marker on the CSIAddonsNode.
func (n *node) start() {
	n.f.t.Helper()
	if err := n.launch(); err != nil {
		n.f.t.Fatal(err)
	}
}

// launch is start for use from any goroutine: it returns what went wrong.
func (n *node) launch() error {
	if err := n.launchDriver(); err != nil {
		return err
	}
	return n.launchSidecar(true)
}

// startDriver starts the driver and adds the volumes it does not hold yet.
func (n *node) startDriver() {
	n.f.t.Helper()
	if err := n.launchDriver(); err != nil {
		n.f.t.Fatal(err)
	}
}

func (n *node) launchDriver() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.driver != nil && n.driver.Running() {
		return fmt.Errorf("the driver of %s started twice", n.name)
	}
	args := []string{
		"--mode", "simulated",
		"--endpoint", n.endpoint(),
		"--control", "unix://" + filepath.Join(n.sockDir, "control.sock"),
		"--state-dir", n.stateDir,
		"--driver-name", n.f.Driver,
		"--node-id", n.name,
		"--volumes", "0",
		"--v", "2",
	}
	proc, err := n.f.s.Procs.Start("driver on "+n.name, n.f.s.Bin.Driver, args, nil, filepath.Join(n.logDir, n.name+"-driver.log"))
	if err != nil {
		return err
	}
	n.driver = proc
	var have []simulated.Volume
	err = harness.WaitFor(n.f.Ctx(), time.Minute, "the driver on "+n.name+" to answer on its control socket", func() (bool, string) {
		if !proc.Running() {
			return true, "exited" // reported below
		}
		var err error
		have, err = n.control.Volumes(n.f.Ctx())
		return err == nil, fmt.Sprint(err)
	})
	if err != nil {
		return err
	}
	if !proc.Running() {
		return fmt.Errorf("the driver on %s exited (%s):\n%s", n.name, proc.ExitStatus(), proc.LogTail(20))
	}
	known := map[string]bool{}
	for _, v := range have {
		known[v.ID] = true
	}
	for _, v := range n.volumes {
		if known[v.Handle] {
			continue // on disk from an earlier start
		}
		if _, err := n.control.AddVolume(n.f.Ctx(), v.Spec()); err != nil {
			return fmt.Errorf("add %s to the driver on %s: %w", v.PV, n.name, err)
		}
	}
	return nil
}

// startSidecar starts a sidecar with a new pod UID; with wait, it returns once the sidecar has
// written its restart marker on the CSIAddonsNode.
func (n *node) startSidecar(wait bool) {
	n.f.t.Helper()
	if err := n.launchSidecar(wait); err != nil {
		n.f.t.Fatal(err)
	}
}

func (n *node) launchSidecar(wait bool) error {
	n.mu.Lock()
	if n.sidecar != nil && n.sidecar.Running() {
		n.mu.Unlock()
		return fmt.Errorf("the sidecar of %s started twice", n.name)
	}
	n.starts++
	n.podUID = fmt.Sprintf("%s-start-%d", n.name, n.starts)
	if n.pod != nil {
		n.podUID = n.pod()
	}
	args := []string{
		"--kubeconfig", n.f.s.Kubeconfig,
		"--driver-endpoint", n.endpoint(),
		"--node-name", n.name,
		"--namespace", n.f.PluginNS,
		"--pod-uid", n.podUID,
		// A new port on each start, as a recreated pod gets a new IP: the controller must follow
		// the endpoint on the CSIAddonsNode.
		"--listen", "127.0.0.1:0",
		"--metrics-address", "0",
		"--shutdown-timeout", "2s",
		"--v", "2",
	}
	if !slices.Contains(n.sidecarArgs, "--tls-cert-file") {
		args = append(args, "--insecure")
	}
	args = append(args, n.sidecarArgs...)
	logPath := filepath.Join(n.logDir, fmt.Sprintf("%s-sidecar-%d.log", n.name, n.starts))
	n.startedAt = time.Now()
	proc, err := n.f.s.Procs.Start("sidecar on "+n.name, n.f.s.Bin.Sidecar, args, nil, logPath)
	if err == nil {
		n.sidecar = proc
	}
	n.mu.Unlock()
	if err != nil || !wait {
		return err
	}
	return n.awaitRegistered(time.Minute)
}

// waitRegistered waits until the CSIAddonsNode carries the restart marker of the current sidecar.
func (n *node) waitRegistered(timeout time.Duration) {
	n.f.t.Helper()
	if err := n.awaitRegistered(timeout); err != nil {
		n.f.t.Fatal(err)
	}
}

func (n *node) awaitRegistered(timeout time.Duration) error {
	n.mu.Lock()
	proc, suffix, startedAt := n.sidecar, "/"+n.podUID, n.startedAt
	n.mu.Unlock()
	err := harness.WaitFor(n.f.Ctx(), timeout, "the sidecar on "+n.name+" to register its restart", func() (bool, string) {
		if !proc.Running() {
			return true, "exited" // reported below
		}
		var obj csiaddonsv1alpha1.CSIAddonsNode
		if err := n.f.Client.Get(n.f.Ctx(), n.f.AddonsNodeKey(n.name), &obj); err != nil {
			return false, err.Error()
		}
		// A sidecar restarted in the same pod keeps the pod UID: the time tells the starts apart.
		marker := obj.Annotations[annotations.HealerRestart]
		at, ok := annotations.HealerRestartTime(marker)
		return strings.HasSuffix(marker, suffix) && ok && !at.Before(startedAt), "marker " + marker
	})
	if err == nil && !proc.Running() {
		err = fmt.Errorf("the sidecar on %s exited (%s):\n%s", n.name, proc.ExitStatus(), proc.LogTail(20))
	}
	return err
}

// stop stops the plugin: the sidecar first, so that no call reaches the driver after its call log
// was read, then the driver.
func (n *node) stop() error {
	return errors.Join(n.stopSidecar(), n.stopDriver())
}

// stopSidecar stops the sidecar with SIGTERM.
func (n *node) stopSidecar() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sidecar == nil {
		return nil
	}
	return n.sidecar.Stop(processGrace)
}

// stopDriver records what the driver served and stops it with SIGTERM.
func (n *node) stopDriver() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.driver == nil || !n.driver.Running() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	calls, err := n.control.Calls(ctx)
	if err != nil {
		return fmt.Errorf("read the call log of the driver on %s: %w", n.name, err)
	}
	counters, err := n.control.Counters(ctx)
	if err != nil {
		return fmt.Errorf("read the counters of the driver on %s: %w", n.name, err)
	}
	n.pastCalls = append(n.pastCalls, calls...)
	n.pastCounters = append(n.pastCounters, counters)
	return n.driver.Stop(processGrace)
}

// restart stops the node plugin and starts it again, as a crash or an upgrade of its pod does.
func (n *node) restart() {
	n.f.t.Helper()
	if err := n.stop(); err != nil {
		n.f.t.Fatal(err)
	}
	n.start()
}

// sidecarProc is the current sidecar process.
func (n *node) sidecarProc() *harness.Process {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sidecar
}

// record returns every call the node's drivers served, over all starts, and the counters of each
// driver process. The running driver must answer.
func (n *node) record() ([]control.Call, []control.Counters, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	calls := append([]control.Call(nil), n.pastCalls...)
	counters := append([]control.Counters(nil), n.pastCounters...)
	if n.driver == nil || !n.driver.Running() {
		return calls, counters, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	live, err := n.control.Calls(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("read the call log of the driver on %s: %w", n.name, err)
	}
	c, err := n.control.Counters(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("read the counters of the driver on %s: %w", n.name, err)
	}
	return append(calls, live...), append(counters, c), nil
}

// inFlight returns the calls the running driver serves now.
func (n *node) inFlight() int64 {
	n.f.t.Helper()
	c, err := n.control.Counters(n.f.Ctx())
	if err != nil {
		n.f.t.Fatalf("read the counters of the driver on %s: %v", n.name, err)
	}
	return c.InFlight
}

// newVolumes describes n volumes of class on node nd, named <fixture>-<tag>-<i>, which its driver
// gets when it starts. mounter is the driver's: "rbd-nbd" or "krbd".
func (f *fixture) newVolumes(nd *node, class, mounter, tag string, n int) []*volume {
	vols := f.NewVolumes(nd.name, nd.control, class, mounter, tag, n)
	nd.volumes = append(nd.volumes, vols...)
	return vols
}
