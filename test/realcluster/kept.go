package realcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	"github.com/volume-healer/volume-healer/test/harness"
)

// The third release of the reference driver's chart: Healer mode with the mount supervisor
// (supervisor.enabled), whose mounters run outside the node plugin and keep their FUSE
// connections across a mounter restart.
const (
	keptNS        = "healer-kept"
	keptRelease   = "healer-refdriver-kept"
	keptDriver    = "kept.healer.example.com"
	keptClass     = "healer-kept"
	keptDS        = "healer-refdriver-kept-node"
	keptSupDS     = "healer-refdriver-kept-supervisor"
	keptStateDir  = "/var/lib/healer-refdriver-kept"
	keptSupState  = "/var/lib/healer-refdriver-kept-supervisor"
	keptSupSocket = "/var/run/healer-refdriver-kept-supervisor"
	// keptPods selects the kept driver's node plugin pods.
	keptPods = "app.kubernetes.io/instance=" + keptRelease + ",app.kubernetes.io/component=node-plugin"
)

// InstallKept installs the reference driver's chart a third time, in Healer mode with the mount
// supervisor, with the healer sidecar beside its node plugin, and waits until kubelet registered
// it.
func (e *Env) InstallKept(t harness.TB) {
	t.Helper()
	e.kept = true
	e.installDriverRelease(t, driverRelease{
		release: keptRelease, namespace: keptNS, driver: keptDriver, class: keptClass, image: "healer-refdriver",
		folders: []string{keptStateDir, keptSupState, keptSupSocket}, what: "Healer mode, mount supervisor",
		values: []string{"stateDir=" + keptStateDir,
			"supervisor.enabled=true", "supervisor.stateDir=" + keptSupState, "supervisor.socketDir=" + keptSupSocket},
	})
}

// HeldWorkload creates a one-pod StatefulSet on class whose writer uses its volume the way of
// mode (test/workload's -mode: hold keeps one file open for the whole run, dirfd one folder).
func (e *Env) HeldWorkload(class, name string, propagation corev1.MountPropagationMode, mode string) *Workload {
	e.t.Helper()
	w := &Workload{e: e, name: name, propagation: propagation, mode: mode, selector: labels.SelectorFromSet(labels.Set{"app": name}),
		statefulSet: true, claims: []string{"data-" + name + "-0"}}
	ss := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: appsNS},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To(int32(1)),
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:            &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{e.container(w)}, TerminationGracePeriodSeconds: ptr.To[int64](1)},
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"}, Spec: pvcSpec(class)}},
		},
	}
	if _, err := e.c.Clientset.AppsV1().StatefulSets(appsNS).Create(e.t.Context(), ss, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("%v", err)
	}
	return w
}

// RolloutRestartKept restarts the kept driver's node plugin DaemonSet, as an upgrade does.
func (e *Env) RolloutRestartKept(t harness.TB) {
	t.Helper()
	e.must(t, "kubectl", "rollout", "restart", "daemonset/"+keptDS, "--namespace", keptNS)
	e.must(t, "kubectl", "rollout", "status", "daemonset/"+keptDS, "--namespace", keptNS, "--timeout", "3m")
}

// KillKeptDriverContainer kills the kept driver's node plugin process with SIGKILL; kubelet
// restarts the container in the same pod. Its mounters run in the supervisor's pod.
func (e *Env) KillKeptDriverContainer(t harness.TB) {
	t.Helper()
	e.killContainer(t, keptNS, keptPods, "refdriver")
}

// UpgradeSupervisor rolls the kept driver's supervisor DaemonSet as an upgrade of it does: the
// new pod starts beside the old one (maxSurge 1), takes the FUSE connections over, and the old
// one stops.
func (e *Env) UpgradeSupervisor(t harness.TB) {
	t.Helper()
	e.must(t, "kubectl", "rollout", "restart", "daemonset/"+keptSupDS, "--namespace", keptNS)
	e.must(t, "kubectl", "rollout", "status", "daemonset/"+keptSupDS, "--namespace", keptNS, "--timeout", "3m")
}

// SyscallReport is what one workload's writer saw in one window: its failed system calls, the
// records it reported written that are not in the volume's backing file afterwards, and how long
// its tries took (a try that waits for a mounter shows as a stall, not a failure).
type SyscallReport struct {
	Workload string
	Tries    int
	Failed   int
	// FirstFailure says how the first failed try failed.
	FirstFailure string
	// Lost counts the records the writer reported written that its data file does not hold;
	// -1 when it was not checked (the pod was replaced, or the mode keeps no records).
	Lost int
	// Stalls are the tries' durations.
	Stalls []time.Duration
	// Restarted is true when the writer's pod was replaced or its container restarted.
	Restarted bool
}

// Syscalls reads what the workload's pod saw between from and to, and checks its records
// against the backing file of its volume in stateDir (the driver's node folder).
func (w *Workload) Syscalls(t harness.TB, stateDir string, from, to time.Time, pod *corev1.Pod) SyscallReport {
	t.Helper()
	ctx := t.Context()
	r := SyscallReport{Workload: w.name, Lost: -1}
	cur, err := w.pod(ctx)
	if err != nil || cur.UID != pod.UID || writerRestarts(cur) != writerRestarts(pod) {
		r.Restarted = true
	}
	tries, err := w.tries(ctx, pod.Name)
	if err != nil {
		t.Errorf("read the tries of %s: %v", pod.Name, err)
		return r
	}
	for _, tr := range tries {
		if tr.Time.Before(from) || tr.Time.After(to) {
			continue
		}
		r.Tries++
		r.Stalls = append(r.Stalls, time.Duration(tr.Took*float64(time.Second)))
		if !tr.OK {
			if r.Failed == 0 {
				r.FirstFailure = tr.Op + ": " + tr.Err
			}
			r.Failed++
		}
	}
	if w.mode == "hold" && !r.Restarted {
		r.Lost = w.lostRecords(t, stateDir, tries)
	}
	return r
}

// lostRecords counts the tries reported written whose record is not at its place in the data
// file, read from the volume's backing folder on the node (what the mounter wrote through).
func (w *Workload) lostRecords(t harness.TB, stateDir string, tries []try) int {
	t.Helper()
	handle := w.e.volumeHandle(t, w.claim())
	file := filepath.Join(stateDir, "volumes", handle, w.name+".data")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Errorf("read %s's data file %s: %v", w.name, file, err)
		return len(tries)
	}
	lost := 0
	for _, tr := range tries {
		if !tr.OK {
			continue
		}
		want := heldRecord(tr.Seq, tr.Time)
		off := (tr.Seq - 1) * int64(len(want))
		if int64(len(data)) < off+int64(len(want)) || string(data[off:off+int64(len(want))]) != want {
			lost++
		}
	}
	return lost
}

// heldRecord is the record test/workload's -mode hold writes for try seq begun at begun: 64
// bytes, the try's number and time padded with spaces, ending in a newline.
func heldRecord(seq int64, begun time.Time) string {
	return fmt.Sprintf("%-63s\n", fmt.Sprintf("%d %s", seq, begun.Format(time.RFC3339Nano)))
}

// SyscallTable gathers the reports of a run, by disruption and path.
type SyscallTable struct {
	rows []syscallRow
}

type syscallRow struct {
	what, path string
	r          SyscallReport
}

// Add records r of the workload on path (how the driver gets the volume back) for what broke.
func (s *SyscallTable) Add(what, path string, r SyscallReport) {
	s.rows = append(s.rows, syscallRow{what, path, r})
}

// String renders the table in Markdown.
func (s *SyscallTable) String() string {
	var b strings.Builder
	b.WriteString("| disruption | path | workload | tries | failed syscalls | lost writes | stall p50 | stall p99 | stall max |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range s.rows {
		lost := "n/a"
		if row.r.Lost >= 0 {
			lost = fmt.Sprint(row.r.Lost)
		}
		failed := fmt.Sprint(row.r.Failed)
		if row.r.Failed > 0 {
			failed += " (" + row.r.FirstFailure + ")"
		}
		if row.r.Restarted {
			failed += ", pod restarted"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %s | %s | %s | %s | %s |\n", row.what, row.path, row.r.Workload, row.r.Tries, failed, lost,
			fmtMillis(Percentile(row.r.Stalls, 50)), fmtMillis(Percentile(row.r.Stalls, 99)), fmtMillis(Percentile(row.r.Stalls, 100)))
	}
	return b.String()
}

// fmtMillis writes d in milliseconds, "-" for none.
func fmtMillis(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
}

// WaitKeptSwept waits until the running kept node plugin pod's restart is recorded handled on
// its CSIAddonsNode, with the driver in tier healer, and returns what the controller recorded of
// that sweep.
func (e *Env) WaitKeptSwept(t harness.TB, timeout time.Duration) stockNode {
	t.Helper()
	c := e.crClient(t)
	var swept stockNode
	harness.Eventually(t, timeout, "the kept driver's restart to be swept", func() (bool, string) {
		ctx := t.Context()
		pods, err := e.c.Clientset.CoreV1().Pods(keptNS).List(ctx, metav1.ListOptions{LabelSelector: keptPods})
		if err != nil {
			return false, err.Error()
		}
		if len(pods.Items) != 1 || pods.Items[0].DeletionTimestamp != nil {
			return false, fmt.Sprintf("%d kept node plugin pods, want one that is not going away", len(pods.Items))
		}
		n, err := e.driverCSIAddonsNode(ctx, c, keptNS, keptDriver)
		switch {
		case err != nil:
			return false, err.Error()
		case n.pod != pods.Items[0].UID:
			return false, fmt.Sprintf("restart marker %q is not of the running pod %s", n.restart, pods.Items[0].UID)
		case n.tier["tier"] != "healer":
			return false, fmt.Sprintf("driver tier %v, want healer", n.tier)
		case n.handled == "" || !strings.Contains(n.handled, n.restart):
			return false, fmt.Sprintf("handled marker %q, restart marker %q", n.handled, n.restart)
		}
		swept = n
		return true, ""
	})
	return swept
}

// keptDisruption is one way the suite breaks both drivers' node side at once.
type keptDisruption struct {
	what string
	// heal breaks the Healer-mode driver (today's path); nil when it has no counterpart.
	heal func(t harness.TB)
	// kept breaks the driver with the mount supervisor.
	kept func(t harness.TB)
	// restartsPlugin is true when the kept driver's node plugin restarts: the proof then waits
	// for the controller to sweep that restart.
	restartsPlugin bool
	// needsResend is true when the kept path survives it only where the kernel resends a dead
	// mounter's unanswered requests (FUSE_NOTIFY_RESEND): elsewhere the proof reports what
	// failed instead of failing.
	needsResend bool
}

// ProveKeptMounts runs the same workloads on the driver with the mount supervisor and on the
// Healer-mode driver (today's heal path), each in the three ways a workload can hold its volume
// (a file kept open, with propagation HostToContainer and None, and a folder kept open), breaks
// both drivers' node side the ways production does, and counts every failed system call and
// every record reported written that is not in the volume's backing file. On the kept driver the
// count must be zero for each, and no pod restarted; today's path is measured beside it.
func (e *Env) ProveKeptMounts(t harness.TB) {
	t.Helper()
	e.InstallKept(t)
	e.WaitKeptSwept(t, 2*time.Minute)
	type pair struct{ kept, heal *Workload }
	pairs := []pair{
		{e.HeldWorkload(keptClass, "kept-hold-h2c", corev1.MountPropagationHostToContainer, "hold"),
			e.HeldWorkload(storageClass, "heal-hold-h2c", corev1.MountPropagationHostToContainer, "hold")},
		{e.HeldWorkload(keptClass, "kept-hold-none", corev1.MountPropagationNone, "hold"),
			e.HeldWorkload(storageClass, "heal-hold-none", corev1.MountPropagationNone, "hold")},
		{e.HeldWorkload(keptClass, "kept-dirfd", corev1.MountPropagationHostToContainer, "dirfd"),
			e.HeldWorkload(storageClass, "heal-dirfd", corev1.MountPropagationHostToContainer, "dirfd")},
	}
	for _, p := range pairs {
		p.kept.WaitWriting(t, time.Time{}, 3*time.Minute, nil)
		p.heal.WaitWriting(t, time.Time{}, 3*time.Minute, nil)
	}
	steps := []keptDisruption{
		{what: "rollout restart of the node plugin", heal: e.RolloutRestart, kept: e.RolloutRestartKept, restartsPlugin: true},
		{what: "kill -9 of the node plugin container", heal: e.KillDriverContainer, kept: e.KillKeptDriverContainer, restartsPlugin: true},
		{what: "kill -9 of one mounter", heal: func(t harness.TB) { e.KillMounter(t, pairs[0].heal) }, kept: func(t harness.TB) { e.KillMounter(t, pairs[0].kept) }, needsResend: true},
		{what: "upgrade of the mount supervisor", kept: e.UpgradeSupervisor, needsResend: true},
	}
	resends, release := kernelResends(t)
	var table SyscallTable
	defer func() {
		t.Logf("failed system calls and lost writes, kept mounts beside today's heal path:\n%s", table.String())
	}()
	for _, step := range steps {
		before := map[*Workload]*corev1.Pod{}
		for _, p := range pairs {
			for _, w := range []*Workload{p.kept, p.heal} {
				pod, err := w.pod(t.Context())
				if err != nil {
					t.Fatalf("%s: %v", step.what, err)
				}
				before[w] = pod
			}
		}
		from := time.Now()
		if step.heal != nil {
			step.heal(t)
		}
		step.kept(t)
		if step.restartsPlugin {
			// The sweep of the kept driver's restart confirms its volumes: kept, none healed.
			n := e.WaitKeptSwept(t, 2*time.Minute)
			if n.sweep == nil || n.sweep.Kept != len(pairs) || n.sweep.Healed != 0 || !strings.Contains(n.sweep.Marker, n.restart) {
				t.Errorf("%s: the controller recorded the kept driver's restart sweep as %+v (restart marker %q); want all %d volumes kept, none healed",
					step.what, n.sweep, n.restart, len(pairs))
			}
		}
		// Long enough for today's path to heal and for a kept mount's requests to be served
		// again: a shorter window could only hide failures of the kept path, not add any.
		select {
		case <-t.Context().Done():
			return
		case <-time.After(keptSettle):
		}
		to := time.Now()
		for _, p := range pairs {
			r := p.kept.Syscalls(t, keptStateDir, from, to, before[p.kept])
			table.Add(step.what, "kept (mount supervisor)", r)
			switch {
			case step.needsResend && !resends:
				t.Logf("%s: %s saw %d failed system calls (first: %s), %d lost writes: kernel %s does not resend a dead mounter's unanswered requests (FUSE_NOTIFY_RESEND, Linux 6.9)",
					step.what, r.Workload, r.Failed, r.FirstFailure, r.Lost, release)
			case r.Failed != 0 || r.Lost > 0 || r.Restarted || r.Tries == 0:
				t.Errorf("%s: %s saw %d failed system calls (first: %s), %d lost writes, restarted %t in %d tries; want none",
					step.what, r.Workload, r.Failed, r.FirstFailure, r.Lost, r.Restarted, r.Tries)
			}
			if step.heal != nil {
				table.Add(step.what, "heal (today)", p.heal.Syscalls(t, driverStateDir, from, to, before[p.heal]))
			}
		}
	}
}

// keptSettle is how long after a disruption the proof keeps counting.
const keptSettle = 8 * time.Second

// kernelResends reads the node's kernel release (this machine's) and says whether it is Linux 6.9
// or later, whose FUSE resends a dead server's unanswered requests to the one that takes its
// connection over. The reference driver advertises MOUNTER_RESTART by the same rule.
func kernelResends(t harness.TB) (bool, string) {
	t.Helper()
	raw, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatalf("read the kernel release: %v", err)
	}
	release := strings.TrimSpace(string(raw))
	var major, minor int
	if n, _ := fmt.Sscanf(release, "%d.%d", &major, &minor); n != 2 {
		t.Fatalf("kernel release %q: not major.minor", release)
	}
	return major > 6 || major == 6 && minor >= 9, release
}
