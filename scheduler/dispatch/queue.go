package dispatch

import (
	"time"

	"github.com/volume-healer/volume-healer/scheduler"
)

// forgetIfSettledLocked drops the state of a volume with nothing queued or in flight whose backoff,
// if any, ended more than BackoffMax ago.
func (d *Dispatcher) forgetIfSettledLocked(vol *volumeState, now time.Time) {
	if vol.queued != nil || vol.inFlight > 0 {
		return
	}
	if vol.retryAt.IsZero() || now.After(vol.retryAt.Add(d.opts.BackoffMax)) {
		delete(d.volumes, vol.name)
	}
}

// pruneLocked sweeps settled volumes out once the map has doubled since the last sweep, which
// keeps the map bounded by the volumes in play at amortized constant cost per Submit.
func (d *Dispatcher) pruneLocked(now time.Time) {
	if len(d.volumes) < d.pruneAt {
		return
	}
	for _, vol := range d.volumes {
		d.forgetIfSettledLocked(vol, now)
	}
	d.pruneAt = max(2*len(d.volumes), pruneFloor)
}

// volumeState is what the Dispatcher knows of one volume.
type volumeState struct {
	name string
	// queued is the volume's one queued job, if any; tasks submitted meanwhile merge into it.
	queued *job
	// inFlight counts the volume's calls in progress; never more than one.
	inFlight int
	// failures counts consecutive failed calls, across tasks; success resets it.
	failures int
	// retryAt is when the volume's backoff ends.
	retryAt time.Time
	// backoffFrom is when the failed call that set retryAt started.
	backoffFrom time.Time
}

// job is a task in the Dispatcher, possibly several merged submissions.
type job struct {
	task Task
	vol  *volumeState
	seq  uint64
	// waiters are the Done callbacks of the submissions merged into the job.
	waiters     []waiter
	firstWaiter [1]waiter
	// attempts counts calls of task.Run; failed and busy count the failed and busy ones.
	attempts, failed, busy int
	where                  int
	index                  int
	eligibleAt, readyAt    time.Time
	// startedAt is when the job's latest call started.
	startedAt time.Time
	lane      *lane
	driver    *driverState
	node      *nodeState
}

// waiter is a Done callback of a submission merged into a job.
type waiter struct {
	done      func(Result)
	coalesced bool
}

func newJob(t Task, vol *volumeState, seq uint64) *job {
	j := &job{task: t, vol: vol, seq: seq, index: -1}
	if t.Done != nil {
		// Most jobs are never merged: their one waiter needs no allocation of its own.
		j.firstWaiter[0] = waiter{done: t.Done}
		j.waiters = j.firstWaiter[:]
	}
	j.task.Done = nil
	return j
}

// merge folds a later submission for the same volume into j.
func (j *job) merge(o *job) {
	if classLess(&o.task, &j.task) {
		for i := range j.waiters {
			j.waiters[i].coalesced = true
		}
		notBefore := j.task.NotBefore
		j.task = o.task
		j.task.NotBefore = notBefore
		j.attempts, j.failed, j.busy = o.attempts, o.failed, o.busy
	} else {
		for i := range o.waiters {
			o.waiters[i].coalesced = true
		}
	}
	j.waiters = append(j.waiters, o.waiters...)
	if o.task.NotBefore.Before(j.task.NotBefore) {
		j.task.NotBefore = o.task.NotBefore
	}
	if o.task.CallsSince.After(j.task.CallsSince) {
		j.task.CallsSince = o.task.CallsSince
	}
}

// triggerRank orders trigger classes: a node plugin that restarted may have lost every mount, an
// operator is waiting on a manual sweep, a periodic sweep can wait.
func triggerRank(t scheduler.Trigger) int {
	switch t {
	case scheduler.TriggerRestart:
		return 0
	case scheduler.TriggerManual:
		return 1
	case scheduler.TriggerSchedule:
		return 2
	default:
		return 3
	}
}

// classLess reports whether a goes before b by trigger class and priority alone.
func classLess(a, b *Task) bool {
	if ra, rb := triggerRank(a.Trigger), triggerRank(b.Trigger); ra != rb {
		return ra < rb
	}
	return a.Priority > b.Priority
}

// dispatchLess is the order within a lane: trigger class, then priority, then first submitted
// first.
func dispatchLess(a, b *job) bool {
	if classLess(&a.task, &b.task) {
		return true
	}
	if classLess(&b.task, &a.task) {
		return false
	}
	return a.seq < b.seq
}

// waitsLess orders the timer heap: earliest eligible first.
func waitsLess(a, b *job) bool {
	if !a.eligibleAt.Equal(b.eligibleAt) {
		return a.eligibleAt.Before(b.eligibleAt)
	}
	return a.seq < b.seq
}

// jobHeap is a heap of jobs that keeps each job's index current.
type jobHeap struct {
	items []*job
	less  func(a, b *job) bool
}

func (h *jobHeap) Len() int { return len(h.items) }

func (h *jobHeap) Less(i, j int) bool { return h.less(h.items[i], h.items[j]) }

func (h *jobHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].index = i
	h.items[j].index = j
}

func (h *jobHeap) Push(x any) {
	j := x.(*job)
	j.index = len(h.items)
	h.items = append(h.items, j)
}

func (h *jobHeap) Pop() any {
	n := len(h.items) - 1
	j := h.items[n]
	h.items[n] = nil
	h.items = h.items[:n]
	j.index = -1
	return j
}
