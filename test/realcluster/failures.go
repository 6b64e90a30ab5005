package realcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/test/harness"
)

// RolloutRestart restarts the node plugin's DaemonSet as an upgrade does: kubectl rollout restart.
func (e *Env) RolloutRestart(t harness.TB) {
	t.Helper()
	e.must(t, "kubectl", "rollout", "restart", "daemonset/"+nodePluginDS, "--namespace", driverNS)
}

// RemoveData removes the backing folder of the volume of claim (a claim of a workload) from the
// reference driver's state on the node, as a disk lost for good would: the driver then reports
// the volume DATA_LOSS and cannot heal it. It returns the volume's ID and the folder removed.
func (e *Env) RemoveData(t harness.TB, claim string) (volumeID, folder string) {
	t.Helper()
	handle := e.volumeHandle(t, claim)
	folder = filepath.Join(driverStateDir, "volumes", handle)
	if _, err := os.Stat(folder); err != nil {
		t.Fatalf("the backing folder of volume %s: %v", handle, err)
	}
	if err := os.RemoveAll(folder); err != nil {
		t.Fatalf("remove the data of volume %s: %v", handle, err)
	}
	return handle, folder
}

// volumeHandle returns the CSI volume ID of the PV bound to claim.
func (e *Env) volumeHandle(t harness.TB, claim string) string {
	t.Helper()
	ctx := t.Context()
	pvc, err := e.c.Clientset.CoreV1().PersistentVolumeClaims(appsNS).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%v", err)
	}
	pv, err := e.c.Clientset.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%v", err)
	}
	if pv.Spec.CSI == nil {
		t.Fatalf("PV %s of claim %s is not a CSI volume", pv.Name, claim)
	}
	return pv.Spec.CSI.VolumeHandle
}

// KillMounter kills the FUSE daemon of w's volume with SIGKILL.
func (e *Env) KillMounter(t harness.TB, w *Workload) {
	t.Helper()
	e.signalMounter(t, w.claim(), syscall.SIGKILL)
}

// signalMounter sends sig to the FUSE daemon of claim's volume and returns its PID.
func (e *Env) signalMounter(t harness.TB, claim string, sig syscall.Signal) int {
	t.Helper()
	handle := e.volumeHandle(t, claim)
	pid := mounterPID(handle)
	if pid == 0 {
		t.Fatalf("no mounter process of volume %s", handle)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatalf("kill -%d %d (mounter of %s): %v", sig, pid, handle, err)
	}
	t.Logf("sent %s to the mounter of %s (pid %d): %s", unix.SignalName(sig), handle, pid, strings.Join(harness.CommandLine(pid), " "))
	return pid
}

// mounterPID returns the PID of the FUSE daemon of the volume handle; 0 when none runs.
func mounterPID(handle string) int {
	for _, pid := range mounterPIDs() {
		if slices.ContainsFunc(harness.CommandLine(pid), func(a string) bool { return strings.Contains(a, handle) }) {
			return pid
		}
	}
	return 0
}

// mounterPIDs lists the reference driver's FUSE daemons on the node: the processes run as
// "<driver binary> mounter ...".
func mounterPIDs() []int {
	return harness.ProcessesWhere(func(pid int) bool {
		args := harness.CommandLine(pid)
		return len(args) > 1 && args[1] == "mounter"
	})
}

// The remedies of the outage table, by the way the workloads got their volume back.
const (
	RemedyHeal             = "in-place heal (HostToContainer)"
	RemedyContainerRestart = "container restart (None, CRI on)"
	// RemedyContainerRestartAgain is a container restart of a pod whose container kubelet
	// restarted before.
	RemedyContainerRestartAgain = "container restart of a restarted container (None, CRI on)"
	RemedyEviction              = "eviction (None, CRI off)"
	RemedyRecycle               = "recycle (stock driver, rclone)"
)

// Disrupt runs breakIt at a moment it notes, then checks what the workloads saw: the shared pod's
// writes failed and came back in the same pod (the heal reached it in place); the private pod,
// which keeps the dead mount (propagation None), was evicted and replaced by one that writes, or,
// once EnableContainerRestart gave the sidecar the container runtime, kept its pod and got its
// container restarted; and the Events of both on their PVCs and pods. Each workload's outage, from
// its first failed try to its first good one, goes into the table under its remedy.
func (e *Env) Disrupt(t harness.TB, shared, private *Workload, what string, breakIt func()) {
	ctx := t.Context()
	sharedPod, err := shared.pod(ctx)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var privatePod *corev1.Pod
	var privateRec *Recorder
	at := time.Now()
	if private != nil {
		if privatePod, err = private.pod(ctx); err != nil {
			t.Fatalf("%v", err)
		}
		// An evicted pod takes its output with it: record it while it goes.
		privateRec = private.Record(at)
		defer privateRec.Stop()
	}
	breakIt()

	// The shared pod keeps its container: its own writes resume once the volume is healed. A heal
	// may also come between two of its tries (100ms apart), before any of them failed: then the
	// heal's Event and a good try after it are what it saw.
	var o outage
	var healedFirst time.Time
	harness.Eventually(t, 3*time.Minute, "the shared workload's writes to fail and resume in pod "+sharedPod.Name, func() (bool, string) {
		o, err = shared.outageOf(ctx, sharedPod.Name, at)
		switch {
		case err != nil:
			return false, err.Error()
		case o.firstFailure == nil:
			if healed := e.eventSince(ctx, "PersistentVolumeClaim", shared.claim(), healer.ReasonVolumeHealed, at); !healed.IsZero() {
				if first, err := shared.FirstWrite(ctx, sharedPod.Name, healed.Add(time.Second)); err == nil && !first.IsZero() {
					healedFirst = healed
					return true, ""
				}
			}
			return false, "no failed try yet"
		case o.resumed == nil:
			return false, fmt.Sprintf("failing since #%d: %s %s", o.firstFailure.Seq, o.firstFailure.Op, o.firstFailure.Err)
		}
		return true, ""
	})
	now, err := shared.pod(ctx)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if now.UID != sharedPod.UID {
		t.Errorf("the shared workload's pod was replaced (%s -> %s); a HostToContainer pod must see the healed mount in place", sharedPod.Name, now.Name)
	}
	if o.firstFailure == nil {
		t.Logf("%s: the volume was healed (%s) before any of the shared workload's tries failed; it writes on", what, healedFirst.Format(time.TimeOnly))
	} else {
		t.Logf("%s: the shared workload's I/O failed %s after it (%s: %s) and resumed %s after it (%s of failed tries)",
			what, o.firstFailure.Time.Sub(at).Round(time.Millisecond), o.firstFailure.Op, o.firstFailure.Err,
			o.resumed.Time.Sub(at).Round(time.Millisecond), o.resumed.Time.Sub(o.firstFailure.Time).Round(time.Millisecond))
		e.outages.Add(RemedyHeal, what, o.resumed.Time.Sub(o.firstFailure.Time))
	}

	e.expectEvent(t, "PersistentVolumeClaim", shared.claim(), healer.ReasonVolumeHealed, at)
	if private == nil {
		return
	}
	// The private pod cannot see the healed mount: the PVC says so, and the policy restarts its
	// container in place where the sidecar can, or evicts it.
	e.expectEvent(t, "PersistentVolumeClaim", private.claim(), healer.ReasonVolumePodsMustRestart, at)
	remedy := RemedyEviction
	if e.opts.ContainerRestart {
		remedy = RemedyContainerRestart
		before := writerRestarts(privatePod)
		if before > 0 {
			// kubelet starts a container that stopped again after a restart only after its
			// crash back-off (10s, doubling).
			remedy = RemedyContainerRestartAgain
		}
		harness.Eventually(t, 3*time.Minute, "the private pod "+privatePod.Name+" to write again from a restarted container", func() (bool, string) {
			p, err := e.c.Clientset.CoreV1().Pods(appsNS).Get(ctx, privatePod.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if p.UID != privatePod.UID || p.DeletionTimestamp != nil {
				return false, fmt.Sprintf("pod %s is going or was replaced", privatePod.Name)
			}
			if n := writerRestarts(p); n <= before {
				state, _ := private.podState(ctx, p)
				return false, fmt.Sprintf("writer restartCount %d (was %d); latest try: %s", n, before, state)
			}
			ok, failure, err := private.PodState(ctx, p.Name)
			if err != nil || !ok {
				return false, fmt.Sprintf("restarted, not writing yet: %s %v", failure, err)
			}
			return true, ""
		})
		e.expectEvent(t, "Pod", privatePod.Name, evict.ReasonContainersRestarted, at)
		if now, err := private.pod(ctx); err != nil || now.UID != privatePod.UID {
			t.Errorf("the private workload's pod %s was replaced (%v); its container must restart in place", privatePod.Name, err)
		}
		t.Logf("%s: the private workload's pod %s writes again from a restarted container, %s after it", what, privatePod.Name, time.Since(at).Round(100*time.Millisecond))
	} else {
		replaced := private.WaitWriting(t, at, 3*time.Minute, privatePod)
		t.Logf("%s: the private workload's pod %s was evicted and %s writes, %s after it", what, privatePod.Name, replaced.Name, time.Since(at).Round(100*time.Millisecond))
		e.expectEvent(t, "Pod", privatePod.Name, evict.ReasonEvictedForStaleMount, at)
	}
	var po SlotOutage
	harness.Eventually(t, time.Minute, "the private workload's recorded tries to show its outage", func() (bool, string) {
		po = privateRec.Outages()[private.name]
		return po.Over(), po.String()
	})
	t.Logf("%s: the private workload: %s", what, po)
	e.outages.Add(remedy, what, po.Duration())
}

// writerRestarts is the restart count of the pod's writer container.
func writerRestarts(p *corev1.Pod) int32 {
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == "writer" {
			return s.RestartCount
		}
	}
	return 0
}

// Outages is the table of the workloads' outages by remedy that Disrupt and DisruptStock fill.
func (e *Env) Outages() *OutageTable { return &e.outages }

// claim is the name of the workload's (first) PVC.
func (w *Workload) claim() string { return w.claims[0] }

// eventSince returns the time of the latest Event of reason on the object kind/name in the
// workloads' namespace at or after since, zero when there is none (or it cannot be read).
func (e *Env) eventSince(ctx context.Context, kind, name, reason string, since time.Time) time.Time {
	sel := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "reason": reason}.AsSelector().String()
	list, err := e.c.Clientset.CoreV1().Events(appsNS).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return time.Time{}
	}
	var latest time.Time
	for _, ev := range list.Items {
		last := ev.LastTimestamp.Time
		if ev.EventTime.After(last) {
			last = ev.EventTime.Time
		}
		if !last.Before(since.Truncate(time.Second)) && last.After(latest) {
			latest = last
		}
	}
	return latest
}

// expectEvent waits for an Event of reason on the object kind/name in the workloads' namespace,
// at or after since.
func (e *Env) expectEvent(t harness.TB, kind, name, reason string, since time.Time) {
	t.Helper()
	sel := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "reason": reason}.AsSelector().String()
	harness.Eventually(t, time.Minute, fmt.Sprintf("a %s Event on %s %s", reason, kind, name), func() (bool, string) {
		list, err := e.c.Clientset.CoreV1().Events(appsNS).List(t.Context(), metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return false, err.Error()
		}
		for _, ev := range list.Items {
			last := ev.LastTimestamp.Time
			if ev.EventTime.After(last) {
				last = ev.EventTime.Time
			}
			if !last.Before(since.Truncate(time.Second)) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d older ones", len(list.Items))
	})
}

// KillDriverContainer kills the node plugin's driver process with SIGKILL, as the OOM killer
// would; kubelet restarts the container in the same pod.
func (e *Env) KillDriverContainer(t harness.TB) {
	t.Helper()
	e.killContainer(t, driverNS, nodePluginPods, "refdriver")
}

// KillControllerContainer kills the controller's process with SIGKILL; kubelet restarts the
// container in the same pod.
func (e *Env) KillControllerContainer(t harness.TB) {
	t.Helper()
	e.killContainer(t, healerNS, controllerPods, "controller")
}

// containerRestartBound is how long kubelet may take to restart a killed container: its
// crash-loop back-off doubles from 10s at each restart up to 5 minutes (reset after 10 minutes
// of running), and the container must then start and be ready.
const containerRestartBound = 6 * time.Minute

// controllerPods selects the controller's pods.
const controllerPods = "app.kubernetes.io/component=controller"

// killContainer kills the first process of the container named container in the running pod
// that selector finds in ns with SIGKILL, and waits until kubelet restarted it and it is ready.
func (e *Env) killContainer(t harness.TB, ns, selector, container string) {
	t.Helper()
	ctx := t.Context()
	pod, id := e.runningContainer(ctx, t, ns, selector, container)
	pid := e.containerPID(ctx, t, id)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d (the %s container of %s): %v", pid, container, pod.Name, err)
	}
	harness.Eventually(t, containerRestartBound, "kubelet to restart the "+container+" container of "+pod.Name, func() (bool, string) {
		p, err := e.c.Clientset.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if s := containerStatus(p, container); s != nil {
			return s.RestartCount > restarts(pod, container) && s.Ready, fmt.Sprintf("restartCount %d, ready %t", s.RestartCount, s.Ready)
		}
		return false, "no " + container + " container status"
	})
}

func containerStatus(p *corev1.Pod, container string) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == container {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

func restarts(p *corev1.Pod, container string) int32 {
	if s := containerStatus(p, container); s != nil {
		return s.RestartCount
	}
	return 0
}

// runningContainer returns the running pod that selector finds in ns (not being deleted) and
// the containerd ID of its container named container.
func (e *Env) runningContainer(ctx context.Context, t harness.TB, ns, selector, container string) (*corev1.Pod, string) {
	t.Helper()
	list, err := e.c.Clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatalf("%v", err)
	}
	for _, p := range list.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		if s := containerStatus(&p, container); s != nil && s.ContainerID != "" {
			return &p, strings.TrimPrefix(s.ContainerID, "containerd://")
		}
	}
	t.Fatalf("no running pod in %s (%s) with a %s container", ns, selector, container)
	return nil, ""
}

// containerPID finds the host PID of the container's first process (containerFirstPID).
func (e *Env) containerPID(_ context.Context, t harness.TB, id string) int {
	t.Helper()
	pid, err := containerFirstPID(id)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return pid
}

// containerFirstPID finds the host PID of the container's first process, from its cgroup: the
// process in the container's cgroup whose parent is outside it.
func containerFirstPID(id string) (int, error) {
	matches, _ := filepath.Glob("/sys/fs/cgroup/pids/kubepods/*/*/" + id + "/cgroup.procs")
	matches2, _ := filepath.Glob("/sys/fs/cgroup/pids/kubepods/*/" + id + "/cgroup.procs")
	matches = append(matches, matches2...)
	if len(matches) != 1 {
		return 0, fmt.Errorf("container %s: %d cgroups found", id, len(matches))
	}
	raw, err := os.ReadFile(matches[0])
	if err != nil {
		return 0, err
	}
	in := map[int]bool{}
	for _, f := range strings.Fields(string(raw)) {
		pid, _ := strconv.Atoi(f)
		in[pid] = true
	}
	for pid := range in {
		if stat, ok := harness.ProcessStat(pid); ok && !in[stat.PPID] {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("container %s: no first process among %v", id, in)
}
