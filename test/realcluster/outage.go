package realcluster

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Recorder keeps every try of a workload's pods from the moment a disruption begins: of the pods
// that run, of those being evicted (until kubelet removes them, their output is still readable)
// and of the containers kubelet restarted (their previous output). A pod that a disruption
// replaces takes its output with it, so what it saw can only be read while it goes.
type Recorder struct {
	w     *Workload
	since time.Time
	mu    sync.Mutex
	// tries holds the tries read, by pod UID, container instance and sequence number.
	tries map[tryKey]podTry
	// errs counts the reads that failed; lastErr is the latest.
	errs    int
	lastErr error
	stop    context.CancelFunc
	done    chan struct{}
}

type tryKey struct {
	uid      string
	previous bool
	seq      int64
	at       int64
}

// podTry is one try and the pod that made it.
type podTry struct {
	pod string
	try
}

// recordInterval is how often a Recorder reads its workload's output. An evicted pod of the
// workloads here takes at least its grace period (1s) to go, and a failing one fails every 100ms,
// so a read twice a second sees every pod's failures before the pod is gone.
const recordInterval = 500 * time.Millisecond

// Record starts reading w's tries after since, until Stop.
func (w *Workload) Record(since time.Time) *Recorder {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Recorder{w: w, since: since, tries: map[tryKey]podTry{}, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		tick := time.NewTicker(recordInterval)
		defer tick.Stop()
		for {
			r.read(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return r
}

// Stop ends the reads, after one more, and returns what the recorder saw.
func (r *Recorder) Stop() {
	r.stop()
	<-r.done
	r.read(context.Background())
}

// read reads the output of every pod of the workload, running or going, and of the previous
// container of each restarted one.
func (r *Recorder) read(ctx context.Context) {
	cs := r.w.e.c.Clientset
	list, err := cs.CoreV1().Pods(appsNS).List(ctx, metav1.ListOptions{LabelSelector: r.w.selector.String()})
	if err != nil {
		r.fail(ctx, err)
		return
	}
	// The tries before the disruption are not needed: read from a little before it.
	sinceTime := metav1.NewTime(r.since.Add(-5 * time.Second))
	for _, p := range list.Items {
		for _, s := range p.Status.ContainerStatuses {
			if s.Name != "writer" {
				continue
			}
			if s.State.Running != nil || s.State.Terminated != nil {
				r.readLogs(ctx, &p, false, &sinceTime)
			}
			if s.RestartCount > 0 {
				r.readLogs(ctx, &p, true, &sinceTime)
			}
		}
	}
}

func (r *Recorder) readLogs(ctx context.Context, p *corev1.Pod, previous bool, since *metav1.Time) {
	opts := &corev1.PodLogOptions{Container: "writer", Previous: previous, SinceTime: since}
	raw, err := r.w.e.c.Clientset.CoreV1().Pods(appsNS).GetLogs(p.Name, opts).DoRaw(ctx)
	if err != nil {
		// A pod removed between the list and this read, or a container not started yet: the
		// next read sees the workload as it is then.
		r.fail(ctx, err)
		return
	}
	tries := parseTries(raw)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range tries {
		if t.Time.Before(r.since) {
			continue
		}
		r.tries[tryKey{uid: string(p.UID), previous: previous, seq: t.Seq, at: t.Time.UnixNano()}] = podTry{pod: p.Name, try: t}
	}
}

func (r *Recorder) fail(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs++
	r.lastErr = err
}

// Outages returns what each of the workload's slots saw since the disruption began: a
// StatefulSet's slot is a pod name (its replacement keeps it), a Deployment's is the workload.
func (r *Recorder) Outages() map[string]SlotOutage {
	r.mu.Lock()
	all := make([]podTry, 0, len(r.tries))
	for _, t := range r.tries {
		all = append(all, t)
	}
	r.mu.Unlock()
	bySlot := map[string][]podTry{}
	for _, t := range all {
		slot := r.w.name
		if r.w.statefulSet {
			slot = t.pod
		}
		bySlot[slot] = append(bySlot[slot], t)
	}
	out := map[string]SlotOutage{}
	for slot, tries := range bySlot {
		out[slot] = slotOutage(tries)
	}
	// A slot whose every try after the disruption began was lost with its pod shows nothing.
	for _, slot := range r.w.slots() {
		if _, ok := out[slot]; !ok {
			out[slot] = SlotOutage{}
		}
	}
	return out
}

// ReadErrors says how many reads of the workload's output failed, and the latest failure.
func (r *Recorder) ReadErrors() (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errs, r.lastErr
}

// SlotOutage is what one slot of a workload (a pod and its replacements) saw of a disruption:
// its first failed try after the disruption began, in any of its pods, and the first successful
// try after that, in any of its pods; each zero while there is none.
type SlotOutage struct {
	FirstFailure, Resumed time.Time
	// FailedPod and ResumedPod are the pods that made those tries; Failure says how the first
	// failed try failed.
	FailedPod, ResumedPod, Failure string
}

// Duration is the outage: from the first failed try to the first successful one after it; zero
// while either is missing.
func (o SlotOutage) Duration() time.Duration {
	if o.FirstFailure.IsZero() || o.Resumed.IsZero() {
		return 0
	}
	return o.Resumed.Sub(o.FirstFailure)
}

// Over says whether the slot failed and then resumed.
func (o SlotOutage) Over() bool { return !o.FirstFailure.IsZero() && !o.Resumed.IsZero() }

func (o SlotOutage) String() string {
	switch {
	case o.FirstFailure.IsZero():
		return "no failed try"
	case o.Resumed.IsZero():
		return fmt.Sprintf("failing since %s in pod %s (%s)", o.FirstFailure.Format("15:04:05.000"), o.FailedPod, o.Failure)
	}
	return fmt.Sprintf("failed at %s in pod %s (%s), resumed at %s in pod %s: %s",
		o.FirstFailure.Format("15:04:05.000"), o.FailedPod, o.Failure, o.Resumed.Format("15:04:05.000"), o.ResumedPod,
		o.Duration().Round(time.Millisecond))
}

// slotOutage finds the first failed try and the first successful one after it, by the tries'
// own times, whichever pod or container made them.
func slotOutage(tries []podTry) SlotOutage {
	tries = slices.Clone(tries)
	slices.SortFunc(tries, func(a, b podTry) int { return a.Time.Compare(b.Time) })
	var o SlotOutage
	for _, t := range tries {
		if o.FirstFailure.IsZero() {
			if !t.OK {
				o.FirstFailure, o.FailedPod, o.Failure = t.Time, t.pod, t.Op+": "+t.Err
			}
			continue
		}
		if t.OK {
			o.Resumed, o.ResumedPod = t.Time, t.pod
			break
		}
	}
	return o
}

// slots are the names of the workload's slots.
func (w *Workload) slots() []string {
	if !w.statefulSet {
		return []string{w.name}
	}
	out := make([]string, len(w.claims))
	for i := range w.claims {
		out[i] = fmt.Sprintf("%s-%d", w.name, i)
	}
	return out
}

// OutageTable gathers the workloads' outages by remedy, in the order the remedies were first
// added, and prints them side by side.
type OutageTable struct {
	mu      sync.Mutex
	order   []string
	samples map[string][]time.Duration
	// what says, per remedy, which workloads and disruptions its samples came from.
	what map[string][]string
}

// Add records the outages of one disruption under remedy.
func (t *OutageTable) Add(remedy, what string, outages ...time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.samples == nil {
		t.samples, t.what = map[string][]time.Duration{}, map[string][]string{}
	}
	if _, ok := t.samples[remedy]; !ok {
		t.order = append(t.order, remedy)
	}
	t.samples[remedy] = append(t.samples[remedy], outages...)
	if !slices.Contains(t.what[remedy], what) {
		t.what[remedy] = append(t.what[remedy], what)
	}
}

// String is the table: per remedy the number of samples, p50, p99 and max (nearest rank), and
// where the samples came from.
func (t *OutageTable) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "| remedy | samples | p50 | p99 | max | from |\n|---|---|---|---|---|---|\n")
	for _, remedy := range t.order {
		s := t.samples[remedy]
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s |\n", remedy, len(s),
			fmtSeconds(Percentile(s, 50)), fmtSeconds(Percentile(s, 99)), fmtSeconds(Percentile(s, 100)), strings.Join(t.what[remedy], "; "))
	}
	return b.String()
}

func fmtSeconds(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// Percentile is the p-th percentile of samples by nearest rank (p 100 is the maximum), or -1
// without samples.
func Percentile(samples []time.Duration, p float64) time.Duration {
	if len(samples) == 0 {
		return -1
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}
