package dispatch

import (
	"container/heap"
	"time"
)

// dispatchLocked starts the best ready jobs while the global budget lasts. Each round looks at
// the best lane of every driver with budget left; a best lane whose node is full is parked on the
// node until it frees a slot, so the lanes behind it are reached.
func (d *Dispatcher) dispatchLocked(now time.Time) []call {
	var out []call
	if !d.leaseHeld(now) {
		return nil
	}
	for d.running && d.inFlight < d.opts.Global {
		var best *lane
		for _, ds := range d.driverList {
			if ds.inFlight >= d.opts.PerDriver || len(ds.lanes) == 0 {
				continue
			}
			if l := ds.lanes[0]; best == nil || laneLess(l, best) {
				best = l
			}
		}
		if best == nil {
			break
		}
		if best.node.inFlight >= d.opts.PerNode {
			heap.Pop(&best.driver.lanes)
			best.parked = true
			best.node.blocked = append(best.node.blocked, best)
			continue
		}
		j := heap.Pop(&best.jobs).(*job)
		j.lane = nil
		// Count the call before the lane may be dropped, so its driver and node are kept.
		out = append(out, d.startLocked(j, best.driver, best.node, now))
		best.servedAt = int64(d.stats.Started)
		d.laneChangedLocked(best)
	}
	return out
}

// leaseHeld reports whether calls may start at now: there is no Lease, or its time lies ahead.
func (d *Dispatcher) leaseHeld(now time.Time) bool {
	if d.opts.Lease == nil {
		return true
	}
	until, _ := d.opts.Lease.Until()
	return now.Before(until)
}

// startLocked counts a call of j against every budget and returns it for a goroutine to make.
func (d *Dispatcher) startLocked(j *job, ds *driverState, ns *nodeState, now time.Time) call {
	vol := j.vol
	vol.queued = nil
	j.where = jobRunning
	j.driver, j.node = ds, ns
	j.attempts++
	j.startedAt = now
	d.queued--

	d.inFlight++
	ds.inFlight++
	ns.inFlight++
	vol.inFlight++
	d.stats.MaxInFlight = max(d.stats.MaxInFlight, d.inFlight)
	d.stats.MaxInFlightPerDriver = max(d.stats.MaxInFlightPerDriver, ds.inFlight)
	d.stats.MaxInFlightPerNode = max(d.stats.MaxInFlightPerNode, ns.inFlight)
	d.stats.MaxInFlightPerVolume = max(d.stats.MaxInFlightPerVolume, vol.inFlight)
	d.stats.Started++
	d.calls.Add(1)
	if d.metrics != nil {
		ds.gauge.Set(float64(ds.inFlight))
		d.metrics.budgetWait.WithLabelValues(string(j.task.Trigger)).Observe(now.Sub(j.readyAt).Seconds())
	}

	timeout := j.task.Timeout
	if timeout <= 0 {
		timeout = d.opts.DefaultTimeout
	}
	return call{j: j, ctx: d.callCtx, run: j.task.Run, timeout: timeout}
}

// releaseLocked frees the budget slots of an ended call and brings back the lanes parked on its
// node.
func (d *Dispatcher) releaseLocked(j *job, vol *volumeState) {
	ds, ns := j.driver, j.node
	j.driver, j.node = nil, nil
	d.inFlight--
	ds.inFlight--
	ns.inFlight--
	vol.inFlight--
	if d.metrics != nil {
		ds.gauge.Set(float64(ds.inFlight))
	}
	for i, l := range ns.blocked {
		ns.blocked[i] = nil
		l.parked = false
		heap.Push(&l.driver.lanes, l)
	}
	ns.blocked = ns.blocked[:0]
	d.dropIdleLocked(ds, ns)
}
