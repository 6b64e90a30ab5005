package dispatch

import (
	"container/heap"

	"github.com/prometheus/client_golang/prometheus"
)

// laneLocked returns the lane of (driver, node), creating it and its budget states if needed.
func (d *Dispatcher) laneLocked(driver, node string) *lane {
	key := laneKey{driver: driver, node: node}
	if l := d.lanes[key]; l != nil {
		return l
	}
	ds := d.drivers[driver]
	if ds == nil {
		ds = &driverState{name: driver, lanes: laneHeap{}}
		if d.metrics != nil {
			ds.gauge = d.metrics.inFlight.WithLabelValues(driver)
		}
		d.drivers[driver] = ds
		d.driverList = append(d.driverList, ds)
	}
	ns := d.nodes[node]
	if ns == nil {
		ns = &nodeState{name: node}
		d.nodes[node] = ns
	}
	// A new lane has waited since now, like one served just now.
	l := &lane{key: key, driver: ds, node: ns, index: -1, jobs: jobHeap{less: dispatchLess}, servedAt: int64(d.stats.Started)}
	ds.laneCount++
	ns.lanes = append(ns.lanes, l)
	d.lanes[key] = l
	return l
}

// rankLocked sets a lane's urgency among lanes of equal class from its node's queued tasks and the
// calls started since the lane last started one (or appeared):
//
//	urgency = ready(node) / slots + waited / round
//
// in units of one call's time, where slots is what one node may hold (waitWeight), a round is the
// calls of the budget the lane competes for (queueWeight), and waited counts calls started.
//
// The first term is how long the node needs to work off its queue at its full per-node budget.
// Serving that first is what keeps a node with far more volumes than the others from being left
// to run alone, below the global budget, at the end of a rollout.
//
// The second term bounds how long a small lane waits, which the first alone would not when the
// lanes ahead keep being refilled: a waiting lane gains a node's whole budget of tasks per round,
// so after as many rounds as the node with the most queued work needs at its full pace, it is
// ahead of every lane served meanwhile, and the few still ahead of it have waited longer and drop
// behind once served. One volume has at most one queued task, so that wait is bounded, and it is
// no longer than the node with the most work needs anyway.
// Waiting is counted in calls started rather than on the clock, so the order does not depend on
// how long calls take.
//
// Multiplied by slots x round, and with the calls started so far left out (they are the same for
// every lane), the key does not change while a lane waits, so the driver heaps stay in order
// without a rescan.
func (d *Dispatcher) rankLocked(l *lane) {
	l.urgency = int64(l.node.ready)*d.queueWeight - l.servedAt*d.waitWeight
}

// laneChangedLocked restores the heap order after a lane's jobs changed, and drops a lane that
// became empty. Its node's queue changed with it, so the node's other lanes are ranked again.
func (d *Dispatcher) laneChangedLocked(l *lane) {
	if delta := len(l.jobs.items) - l.counted; delta != 0 {
		l.counted += delta
		l.node.ready += delta
		for _, o := range l.node.lanes {
			if o == l {
				continue
			}
			d.rankLocked(o)
			if o.index >= 0 {
				heap.Fix(&o.driver.lanes, o.index)
			}
		}
	}
	d.rankLocked(l)
	if len(l.jobs.items) == 0 {
		if l.index >= 0 {
			heap.Remove(&l.driver.lanes, l.index)
		}
		if l.parked {
			l.parked = false
			b := l.node.blocked
			for i := range b {
				if b[i] == l {
					b[i] = b[len(b)-1]
					b[len(b)-1] = nil
					l.node.blocked = b[:len(b)-1]
					break
				}
			}
		}
		delete(d.lanes, l.key)
		l.driver.laneCount--
		nl := l.node.lanes
		for i := range nl {
			if nl[i] == l {
				nl[i] = nl[len(nl)-1]
				nl[len(nl)-1] = nil
				l.node.lanes = nl[:len(nl)-1]
				break
			}
		}
		d.dropIdleLocked(l.driver, l.node)
		return
	}
	switch {
	case l.parked:
	case l.index >= 0:
		heap.Fix(&l.driver.lanes, l.index)
	default:
		heap.Push(&l.driver.lanes, l)
	}
}

// dropIdleLocked forgets the budget states of a driver and a node that have neither calls in
// flight nor lanes, so that departed nodes leave nothing behind.
func (d *Dispatcher) dropIdleLocked(ds *driverState, ns *nodeState) {
	if ds.inFlight == 0 && ds.laneCount == 0 && d.drivers[ds.name] == ds {
		delete(d.drivers, ds.name)
		for i, x := range d.driverList {
			if x == ds {
				last := len(d.driverList) - 1
				d.driverList[i] = d.driverList[last]
				d.driverList[last] = nil
				d.driverList = d.driverList[:last]
				break
			}
		}
	}
	if ns.inFlight == 0 && len(ns.lanes) == 0 && d.nodes[ns.name] == ns {
		delete(d.nodes, ns.name)
	}
}

// laneLess orders lanes by their best jobs: trigger class and priority first; between equals, the
// more urgent lane (rankLocked: most queued work on its node, gained on by waiting), then the job
// submitted first. Taking turns instead would leave a node with ten times the others' volumes
// less than its share while they have work, and then running alone with its per-node budget, the
// global budget mostly idle, at the end of a rollout. Nodes of equal work still take turns: the
// one served last has the lowest urgency of them.
func laneLess(a, b *lane) bool {
	ja, jb := a.jobs.items[0], b.jobs.items[0]
	if classLess(&ja.task, &jb.task) {
		return true
	}
	if classLess(&jb.task, &ja.task) {
		return false
	}
	if a.urgency != b.urgency {
		return a.urgency > b.urgency
	}
	return ja.seq < jb.seq
}

// laneKey names a lane.
type laneKey struct{ driver, node string }

// lane holds the ready jobs of one driver on one node.
type lane struct {
	key    laneKey
	driver *driverState
	node   *nodeState
	jobs   jobHeap
	// index is the lane's place in its driver's heap, -1 when not in it.
	index int
	// parked is set while the lane waits for its node to free a slot.
	parked bool
	// counted is the number of the lane's jobs counted in its node's ready.
	counted int
	// servedAt is the count of calls started (Stats.Started) when the lane last started a
	// call, or when it appeared.
	servedAt int64
	// urgency ranks the lane among lanes of equal class, higher first; see rankLocked.
	urgency int64
}

// driverState is one driver's budget and its lanes that have ready jobs.
type driverState struct {
	name      string
	inFlight  int
	lanes     laneHeap
	laneCount int
	gauge     prometheus.Gauge
}

// nodeState is one node's budget, its lanes, and those of them parked while it is full.
type nodeState struct {
	name     string
	inFlight int
	blocked  []*lane
	// lanes are the node's lanes, one per driver with ready jobs there; ready counts their jobs.
	lanes []*lane
	ready int
}

// laneHeap orders a driver's lanes by their best job.
type laneHeap []*lane

func (h laneHeap) Len() int { return len(h) }

func (h laneHeap) Less(i, j int) bool { return laneLess(h[i], h[j]) }

func (h laneHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *laneHeap) Push(x any) {
	l := x.(*lane)
	l.index = len(*h)
	*h = append(*h, l)
}

func (h *laneHeap) Pop() any {
	old := *h
	n := len(old) - 1
	l := old[n]
	old[n] = nil
	*h = old[:n]
	l.index = -1
	return l
}
