package realcluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/volume-healer/volume-healer/test/harness"
)

// The restart-to-I/O measurement's load: manyPods pods of perPod volumes each, 100 volumes of
// the reference driver on the node besides the suite's others, of a StorageClass of its own that
// carries no schedule annotation: the chart's default periodic sweep (every 6 hours) applies to
// them, not the 10-second one of the suite's StorageClass, which would probe them all the time.
// One workload process per pod writes, syncs and reads back each of its volumes (a loop per
// volume) once a second while that works, and every 100 ms after a try failed, so that the first
// good write after a failure is timed to 100 ms; it prints only the tries whose outcome changed.
// Sized so to the 2-core node: 100 volumes cost it 10 processes, 100 tries (about 1,000 FUSE
// requests and 100 fsyncs of the backing files) a second and a few log lines. At a try every
// 100 ms on every volume the node was 90 % busy before any restart, most of it in the mounters'
// and the workloads' system calls, and the heals of a restart queued behind that load.
const (
	manyPods   = 10
	perPod     = 10
	mainPlugin = "app.kubernetes.io/instance=healer-refdriver,app.kubernetes.io/component=node-plugin"
	manyClass  = "healer-fuse-unscheduled"
)

// ManyVolumes creates a StatefulSet of pods pods, each with volumes volumes of the reference
// driver's StorageClass (claims v<j>-<name>-<i>) mounted HostToContainer at /v<j>, and one
// workload process per pod that writes and reads all of them.
func (e *Env) ManyVolumes(name string, pods, volumes int) *Workload {
	e.t.Helper()
	w := &Workload{e: e, name: name, propagation: corev1.MountPropagationHostToContainer, selector: labels.SelectorFromSet(labels.Set{"app": name}), statefulSet: true}
	class := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: manyClass},
		Provisioner:       driverName,
		ReclaimPolicy:     ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingImmediate),
	}
	if _, err := e.c.Clientset.StorageV1().StorageClasses().Create(e.t.Context(), class, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatalf("%v", err)
	}
	img := e.assets.Images["healer-test-workload"]
	args := []string{"-interval", "100ms", "-ok-interval", "1s", "-name", name, "-report", "changes"}
	var mounts []corev1.VolumeMount
	var templates []corev1.PersistentVolumeClaim
	for j := range volumes {
		v := fmt.Sprintf("v%d", j)
		args = append(args, "-dir", "/"+v)
		mounts = append(mounts, corev1.VolumeMount{Name: v, MountPath: "/" + v, MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)})
		templates = append(templates, corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: v}, Spec: pvcSpec(manyClass)})
		for i := range pods {
			w.claims = append(w.claims, fmt.Sprintf("%s-%s-%d", v, name, i))
		}
	}
	e.createStatefulSet(name, pods, corev1.Container{
		Name: "writer", Image: img.Repository + ":" + img.Tag, ImagePullPolicy: corev1.PullNever,
		Args: args, VolumeMounts: mounts,
	}, templates)
	return w
}

// volumeTries reads the tries of every pod of w by pod and folder.
func (w *Workload) volumeTries(t harness.TB) (map[string]map[string][]try, error) {
	pods, err := w.Pods(t.Context())
	if err != nil {
		return nil, err
	}
	out := map[string]map[string][]try{}
	for _, p := range pods {
		tries, err := w.tries(t.Context(), p.Name)
		if err != nil {
			return nil, err
		}
		byDir := map[string][]try{}
		for _, r := range tries {
			byDir[r.Dir] = append(byDir[r.Dir], r)
		}
		out[p.Name] = byDir
	}
	return out, nil
}

// WaitAllVolumesWriting waits until each of the pods pods of w writes and reads each of its
// volumes volumes.
func (w *Workload) WaitAllVolumesWriting(t harness.TB, pods, volumes int, timeout time.Duration) {
	t.Helper()
	harness.Eventually(t, timeout, fmt.Sprintf("%d pods of %s to write and read their %d volumes each", pods, w.name, volumes), func() (bool, string) {
		all, err := w.volumeTries(t)
		if err != nil {
			return false, err.Error()
		}
		if len(all) < pods {
			return false, fmt.Sprintf("%d of %d pods run", len(all), pods)
		}
		for pod, byDir := range all {
			for j := range volumes {
				tries := byDir[fmt.Sprintf("/v%d", j)]
				if len(tries) == 0 || !tries[len(tries)-1].OK {
					return false, fmt.Sprintf("pod %s, /v%d: %s", pod, j, lastTry(tries))
				}
			}
		}
		return true, ""
	})
}

// restartPath is what the restart-to-I/O measurement saw of one node plugin restart, each time
// taken where it happens: the kernel's start time of the new driver container's first process,
// the container runtime's timestamp of the lines that the driver and the healer sidecar log, and
// the workloads' own clock of their tries (one host, one clock).
type restartPath struct {
	containerStart time.Time
	driverServing  time.Time
	// sidecarStart and driverReady are the sidecar's start and the moment it found the driver
	// ready to heal and began writing the restart marker (its log).
	sidecarStart, driverReady time.Time
	// sidecarFirst is the sidecar's first log line, certificate its "Got a serving certificate"
	// (zero when it was given one).
	sidecarFirst, certificate time.Time
	marker                    time.Time
	firstProbe                time.Time
	// heals are the sidecar's answers to the heals of the restart, one per volume healed.
	heals []time.Time
	// healTook and healDriverTook are how long each heal took in the sidecar (the whole call) and
	// in the driver, from the sidecar's "Heal done" lines.
	healTook, healDriverTook []time.Duration
	// healBegan is when each heal began in the driver, and healSteps how long each step of the
	// driver's heals took by step, from the driver's "Healed volume" lines.
	healBegan []time.Time
	healSteps map[string][]time.Duration
	// stepOrder is the order of the steps' first appearance.
	stepOrder []string
	// calls are the controller's probe and heal calls from before the rollout to the last volume
	// back: how many, and their mean duration as the controller saw them.
	calls map[string]callMean
	// failed and resumed are each volume's first failed try after the restart began and its
	// first good try after that, by pod and folder.
	failed, resumed map[string]time.Time
}

// MeasureRestartToIO restarts the reference driver's node plugin (kubectl rollout restart) under
// w's pods and volumes, waits until every volume's writes failed and came back in the same pod,
// and logs the path from the new driver container's start to the workloads' first good writes,
// part by part, with p50, p99 and max over the volumes.
func (e *Env) MeasureRestartToIO(t harness.TB, w *Workload, pods, volumes int) {
	t.Helper()
	ctx := t.Context()
	old, _ := e.runningContainer(ctx, t, driverNS, mainPlugin, "refdriver")
	before, err := w.Pods(ctx)
	if err != nil {
		t.Fatalf("%v", err)
	}
	// What the CPUs do in 3 s of the steady state, all volumes working, before the restart.
	steady, err := readCPUUse()
	time.Sleep(3 * time.Second)
	logCPUSince(t, fmt.Sprintf("in 3 s before the restart, all %d volumes of %s working", pods*volumes, w.name), steady, err, 10)
	callsBefore, callsErr := e.ControllerMetrics(ctx)
	timeline := e.watchPluginPods(t, mainPlugin)
	load := loadAverage()
	at := time.Now()
	e.RolloutRestart(t)

	var p restartPath
	var plugin *corev1.Pod
	harness.Eventually(t, 3*time.Minute, "the new node plugin's driver container to run", func() (bool, string) {
		list, err := e.c.Clientset.CoreV1().Pods(driverNS).List(ctx, metav1.ListOptions{LabelSelector: mainPlugin})
		if err != nil {
			return false, err.Error()
		}
		for i := range list.Items {
			np := &list.Items[i]
			if np.UID == old.UID || np.DeletionTimestamp != nil {
				continue
			}
			s := containerStatus(np, "refdriver")
			if s == nil || s.ContainerID == "" || s.State.Running == nil {
				return false, "the new pod's driver container does not run yet"
			}
			pid, err := containerFirstPID(strings.TrimPrefix(s.ContainerID, "containerd://"))
			if err != nil {
				return false, err.Error()
			}
			if p.containerStart, err = processStart(pid); err != nil {
				return false, err.Error()
			}
			plugin = np
			return true, ""
		}
		return false, "no new node plugin pod yet"
	})
	// What the CPUs did from here, about the new driver container's start, to the last volume back.
	cpuStart, cpuErr := readCPUUse()

	total := pods * volumes
	harness.Eventually(t, 3*time.Minute, fmt.Sprintf("the %d volumes of %s to fail and come back in the same pods", total, w.name), func() (bool, string) {
		all, err := w.volumeTries(t)
		if err != nil {
			return false, err.Error()
		}
		p.failed, p.resumed = map[string]time.Time{}, map[string]time.Time{}
		waiting := []string{}
		for pod, byDir := range all {
			for dir, tries := range byDir {
				key := pod + ":" + dir
				for _, r := range tries {
					switch {
					case r.Time.Before(at):
					case !r.OK && p.failed[key].IsZero():
						p.failed[key] = r.Time
					case r.OK && !p.failed[key].IsZero() && p.resumed[key].IsZero():
						p.resumed[key] = r.Time
					}
				}
				if p.resumed[key].IsZero() {
					waiting = append(waiting, key+" "+lastTry(tries))
				}
			}
		}
		if len(p.resumed) < total {
			slices.Sort(waiting)
			return false, fmt.Sprintf("%d of %d volumes back; waiting: %s", len(p.resumed), total, strings.Join(waiting[:min(len(waiting), 5)], "; "))
		}
		return true, ""
	})
	seen := ""
	if cpuErr == nil {
		seen = fmt.Sprintf(" (seen %s after it)", cpuStart.at.Sub(p.containerStart).Round(time.Millisecond))
	}
	logCPUSince(t, "from the new driver container's start"+seen+" to the last volume back", cpuStart, cpuErr, 15)
	after, err := w.Pods(ctx)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if !slices.EqualFunc(before, after, func(a, b corev1.Pod) bool { return a.UID == b.UID }) {
		t.Errorf("the pods of %s changed across the restart (%d before, %d after): HostToContainer pods must see their volumes healed in place", w.name, len(before), len(after))
	}

	// The controller's calls of the restart, from its call duration histogram.
	callsAfter, err := e.ControllerMetrics(ctx)
	if callsErr != nil || err != nil {
		t.Errorf("the controller's metrics around the restart: %v", errors.Join(callsErr, err))
	} else {
		p.calls = map[string]callMean{}
		for _, op := range []string{"probe", "heal"} {
			want := map[string]string{"operation": op}
			n0, sum0 := harness.HistogramSums(callsBefore, "volume_healer_call_duration_seconds", want)
			n1, sum1 := harness.HistogramSums(callsAfter, "volume_healer_call_duration_seconds", want)
			if n1 > n0 {
				p.calls[op] = callMean{count: n1 - n0, mean: time.Duration((sum1 - sum0) / float64(n1-n0) * float64(time.Second))}
			}
		}
	}

	// The lines logged by the new pod's driver and sidecar, with the runtime's timestamps.
	driverLines := e.timedLines(t, plugin, "refdriver")
	sidecarLines := e.timedLines(t, plugin, "healer-sidecar")
	p.driverServing = firstLine(driverLines, `"Serving"`)
	if len(sidecarLines) > 0 {
		p.sidecarFirst = sidecarLines[0].at
	}
	p.certificate = firstLine(sidecarLines, `"Got a serving certificate"`)
	p.sidecarStart = firstLine(sidecarLines, `"Starting the healer sidecar"`)
	p.driverReady = firstLine(sidecarLines, `"The driver is ready to heal`)
	p.marker = firstLine(sidecarLines, `"CSIAddonsNode registered"`)
	p.firstProbe = firstLine(sidecarLines, `"First probe since the sidecar started"`)
	for _, l := range sidecarLines {
		if strings.Contains(l.text, `"Heal done"`) {
			p.heals = append(p.heals, l.at)
			took, okTook := loggedDuration(l.text, "took")
			driverTook, okDriver := loggedDuration(l.text, "driverTook")
			if !okTook || !okDriver {
				t.Errorf("the sidecar's heal line carries no took and driverTook durations: %s", l.text)
				continue
			}
			p.healTook = append(p.healTook, took)
			p.healDriverTook = append(p.healDriverTook, driverTook)
		}
	}
	p.healSteps = map[string][]time.Duration{}
	for _, l := range driverLines {
		if !strings.Contains(l.text, `"Healed volume"`) {
			continue
		}
		took, okTook := loggedDuration(l.text, "took")
		steps, okSteps := loggedSteps(l.text)
		if !okTook || !okSteps {
			t.Errorf("the driver's heal line carries no took and steps: %s", l.text)
			continue
		}
		p.healBegan = append(p.healBegan, l.at.Add(-took))
		for _, st := range steps {
			if _, seen := p.healSteps[st.name]; !seen {
				p.stepOrder = append(p.stepOrder, st.name)
			}
			p.healSteps[st.name] = append(p.healSteps[st.name], st.took)
		}
	}
	for what, at := range map[string]time.Time{"the driver's Serving line": p.driverServing, "the sidecar's start line": p.sidecarStart, "the sidecar's driver-ready line": p.driverReady, "the sidecar's registration line": p.marker, "the sidecar's first probe line": p.firstProbe} {
		if at.IsZero() {
			t.Errorf("the new node plugin pod %s logged no %s", plugin.Name, what)
		}
	}
	if len(p.heals) < total {
		t.Errorf("the new node plugin's sidecar logged %d heals, want at least the %d volumes of %s", len(p.heals), total, w.name)
	}
	t.Logf("the node plugin's pods during the restart, from kubectl rollout restart:\n%s", timeline.stop(at))
	t.Logf("restart to I/O, %d volumes of %s (%d pods of %d volumes, HostToContainer) on the node plugin, kubectl rollout restart at %s (load average %s, %d CPUs); times from the new driver container's start (%s after the rollout began):\n%s",
		total, w.name, pods, volumes, at.Format("15:04:05.000"), load, runtime.NumCPU(), p.containerStart.Sub(at).Round(time.Millisecond), p.table())
}

// callMean is a count of calls and their mean duration.
type callMean struct {
	count uint64
	mean  time.Duration
}

// table is the path of the restart part by part, from the new driver container's start.
func (p *restartPath) table() string {
	var b strings.Builder
	b.WriteString("| part | count | p50 | p99 | max |\n|---|---|---|---|---|\n")
	one := func(name string, at time.Time) {
		d := at.Sub(p.containerStart)
		fmt.Fprintf(&b, "| %s | 1 | %s | %s | %s |\n", name, fmtMillis(d), fmtMillis(d), fmtMillis(d))
	}
	// durations is one row of many durations: count, p50, p99, max.
	durations := func(name string, ds []time.Duration) {
		if len(ds) == 0 {
			return
		}
		ds = slices.Sorted(slices.Values(ds))
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s |\n", name, len(ds), fmtMillis(percentile(ds, 0.50)), fmtMillis(percentile(ds, 0.99)), fmtMillis(ds[len(ds)-1]))
	}
	// many is the row of times, each measured from from(i).
	many := func(name string, times []time.Time, from func(int) time.Time) {
		ds := make([]time.Duration, len(times))
		for i, at := range times {
			ds[i] = at.Sub(from(i))
		}
		durations(name, ds)
	}
	start := func(int) time.Time { return p.containerStart }
	one("driver container started", p.containerStart)
	one("driver serving (its log)", p.driverServing)
	one("sidecar's first log line", p.sidecarFirst)
	if !p.certificate.IsZero() {
		one("sidecar got its serving certificate (its log)", p.certificate)
	}
	one("sidecar started serving (its log)", p.sidecarStart)
	one("sidecar found the driver ready to heal (its log)", p.driverReady)
	one("restart marker written (sidecar's log)", p.marker)
	one("first probe reached the sidecar", p.firstProbe)
	many("heal answered by the sidecar", p.heals, start)
	durations("one heal's call in the sidecar (duration)", p.healTook)
	durations("one heal in the driver (duration)", p.healDriverTook)
	for _, op := range []string{"probe", "heal"} {
		if c, ok := p.calls[op]; ok {
			fmt.Fprintf(&b, "| controller's %s calls (mean of all) | %d | %s | | |\n", op, c.count, fmtMillis(c.mean))
		}
	}
	many("heal began in the driver", p.healBegan, start)
	for _, name := range p.stepOrder {
		durations("heal step in the driver: "+name, p.healSteps[name])
	}
	var resumed, failedAt []time.Time
	for key, r := range p.resumed {
		resumed = append(resumed, r)
		failedAt = append(failedAt, p.failed[key])
	}
	many("**workload's first good write**", resumed, start)
	many("workload's outage (first failed to first good try)", resumed, func(i int) time.Time { return failedAt[i] })
	return b.String()
}

// loggedDuration reads the duration a klog line carries under key (key="12.5ms").
func loggedDuration(line, key string) (time.Duration, bool) {
	_, rest, ok := strings.Cut(line, " "+key+"=")
	if !ok {
		return 0, false
	}
	value, _, _ := strings.Cut(rest, " ")
	d, err := time.ParseDuration(strings.Trim(value, `"`))
	return d, err == nil
}

// loggedStep is a step of a driver's call as its log line names it.
type loggedStep struct {
	name string
	took time.Duration
}

// loggedSteps reads the steps a driverkit heal line carries (steps="look up 1ms, check 2ms").
func loggedSteps(line string) ([]loggedStep, bool) {
	_, rest, ok := strings.Cut(line, ` steps="`)
	if !ok {
		return nil, false
	}
	value, _, ok := strings.Cut(rest, `"`)
	if !ok {
		return nil, false
	}
	var out []loggedStep
	for _, part := range strings.Split(value, ", ") {
		i := strings.LastIndexByte(part, ' ')
		if i < 0 {
			return nil, false
		}
		d, err := time.ParseDuration(part[i+1:])
		if err != nil {
			return nil, false
		}
		out = append(out, loggedStep{name: part[:i], took: d})
	}
	return out, len(out) > 0
}

// percentile is the q-quantile of sorted ds (nearest rank).
func percentile(ds []time.Duration, q float64) time.Duration {
	i := int(float64(len(ds))*q+0.5) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

// timedLine is a line of a container's log with the container runtime's timestamp.
type timedLine struct {
	at   time.Time
	text string
}

// timedLines reads the log of container in pod p with the runtime's timestamps (kubectl logs
// --timestamps).
func (e *Env) timedLines(t harness.TB, p *corev1.Pod, container string) []timedLine {
	t.Helper()
	raw, err := e.c.Clientset.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: container, Timestamps: true}).DoRaw(t.Context())
	if err != nil {
		t.Fatalf("the log of %s in pod %s: %v", container, p.Name, err)
	}
	var out []timedLine
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		stamp, text, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, stamp)
		if err != nil {
			continue
		}
		out = append(out, timedLine{at: at, text: text})
	}
	return out
}

// firstLine is the time of the first line that contains s, or zero.
func firstLine(lines []timedLine, s string) time.Time {
	for _, l := range lines {
		if strings.Contains(l.text, s) {
			return l.at
		}
	}
	return time.Time{}
}

// processStart is when process pid started, to the kernel's clock tick: its start time since
// boot (/proc/<pid>/stat) placed on the wall clock by CLOCK_BOOTTIME, which counts from boot as
// that start time does (the boot time that /proc/stat gives is whole seconds).
func processStart(pid int) (time.Time, error) {
	proc, err := procfs.NewProc(pid)
	if err != nil {
		return time.Time{}, err
	}
	st, err := proc.Stat()
	if err != nil {
		return time.Time{}, fmt.Errorf("process %d: %w", pid, err)
	}
	var boot unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &boot); err != nil {
		return time.Time{}, err
	}
	now := time.Now()
	sinceBoot := time.Duration(boot.Nano())
	started := time.Duration(st.Starttime) * time.Second / userHZ
	return now.Add(started - sinceBoot), nil
}

// userHZ is the unit of a process's start time in /proc: USER_HZ, which the kernel's ABI fixes at
// 100 on the architectures the node runs on (x86-64, arm64).
const userHZ = 100

// podTimeline notes when the watch of the node plugin's pods saw each change of their lifecycle:
// a pod added, marked for deletion, deleted; a container started or terminated.
type podTimeline struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	lines  []timedLine
}

// watchPluginPods starts a podTimeline of the pods that selector finds in the driver's namespace.
func (e *Env) watchPluginPods(t harness.TB, selector string) *podTimeline {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	list, err := e.c.Clientset.CoreV1().Pods(driverNS).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		cancel()
		t.Fatalf("%v", err)
	}
	w, err := e.c.Clientset.CoreV1().Pods(driverNS).Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: list.ResourceVersion})
	if err != nil {
		cancel()
		t.Fatalf("%v", err)
	}
	tl := &podTimeline{cancel: cancel, done: make(chan struct{})}
	seen := map[types.UID]*corev1.Pod{}
	for i := range list.Items {
		seen[list.Items[i].UID] = &list.Items[i]
	}
	note := func(format string, args ...any) {
		tl.mu.Lock()
		defer tl.mu.Unlock()
		tl.lines = append(tl.lines, timedLine{at: time.Now(), text: fmt.Sprintf(format, args...)})
	}
	go func() {
		defer close(tl.done)
		defer w.Stop()
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			before := seen[p.UID]
			switch {
			case ev.Type == watch.Deleted:
				note("pod %s deleted", p.Name)
				delete(seen, p.UID)
				continue
			case before == nil:
				note("pod %s added", p.Name)
			case before.DeletionTimestamp == nil && p.DeletionTimestamp != nil:
				note("pod %s marked for deletion (grace %ds)", p.Name, ptr.Deref(p.DeletionGracePeriodSeconds, 0))
			}
			for _, c := range p.Status.ContainerStatuses {
				var was *corev1.ContainerStatus
				if before != nil {
					was = containerStatus(before, c.Name)
				}
				switch {
				case c.State.Running != nil && (was == nil || was.State.Running == nil || was.ContainerID != c.ContainerID):
					note("pod %s: container %s running", p.Name, c.Name)
				case c.State.Terminated != nil && (was == nil || was.State.Terminated == nil):
					note("pod %s: container %s terminated (exit %d, %s)", p.Name, c.Name, c.State.Terminated.ExitCode, c.State.Terminated.Reason)
				}
			}
			seen[p.UID] = p
		}
	}()
	return tl
}

// stop ends the watch and returns what it saw, each change timed from at.
func (tl *podTimeline) stop(at time.Time) string {
	tl.cancel()
	<-tl.done
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var b strings.Builder
	for _, l := range tl.lines {
		fmt.Fprintf(&b, "  %+8.3fs %s\n", l.at.Sub(at).Seconds(), l.text)
	}
	return b.String()
}

// loadAverage is the machine's load average over 1, 5 and 15 minutes, as /proc/loadavg says.
func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(raw)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}
