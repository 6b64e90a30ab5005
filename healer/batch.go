package healer

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"

	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/scheduler/dispatch"
	"github.com/volume-healer/volume-healer/scheduler/planner"
)

// tally adds up the outcomes of a sweep's volumes as their tasks end.
type tally struct {
	mu      sync.Mutex
	summary Summary
	// notes say why the sweep is incomplete beyond failed volumes.
	notes []string
	// finished, when set, collects the volumes that finished well (see finishedWell), by
	// volumeKey: a retry of an incomplete restart sweep leaves them out.
	finished map[string]outcome
}

// note records why the sweep is incomplete.
func (t *tally) note(why string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.notes = append(t.notes, why)
}

// add counts the outcome of v.
func (t *tally) add(v planner.Volume, o outcome) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.summary.count(o)
	if t.finished != nil && finishedWell(o) {
		t.finished[volumeKey(v)] = o
	}
}

// finishedWell says whether a volume with outcome o needs no further try: it was decided and
// acted on (or left alone as the policy or the driver said). A failed or undecided volume does.
func finishedWell(o outcome) bool {
	return o != outcomeFailed && o != outcomeUndecided && o != outcomeRecycling
}

// volumeKey names a volume on its node.
func volumeKey(v planner.Volume) string {
	return v.Driver + "/" + v.NodeName + "/" + v.PVName
}

// count counts one volume's outcome.
func (s *Summary) count(o outcome) {
	switch o {
	case outcomeSkipped:
		s.Skipped++
	case outcomeHealthy:
		s.Probed++
	case outcomeKept:
		s.Probed++
		s.Kept++
	case outcomeUnhealthy:
		s.Probed++
		s.Unhealthy++
	case outcomeHealed:
		s.Probed++
		s.Healed++
	case outcomeFailed:
		s.Failed++
	case outcomeUndecided:
		s.Undecided++
	case outcomeWouldProbe:
		s.WouldProbe++
	case outcomeWouldHeal:
		s.WouldHeal++
	case outcomeWouldRecycle:
		s.WouldRecycle++
	case outcomeRecycling:
		s.Probed++
		s.Recycling++
	}
}

// submit decides each volume's action and hands the volumes to act on to the dispatcher, node by
// node, and waits until every task has ended. When finished is not nil, the volumes that finish
// well are added to it. Nodes are prepared concurrently (at most
// Options.PrepareConcurrency at once): a node whose sidecar does not answer its capabilities call
// holds up its own volumes only, and a node's volumes go to the dispatcher as soon as its
// capabilities are known.
func (s *Sweeper) submit(ctx context.Context, sw scheduler.Sweep, vols []planner.Volume, finished map[string]outcome) Summary {
	t := &tally{summary: Summary{Volumes: len(vols)}, finished: finished}
	var tasks, prepared sync.WaitGroup
	slots := make(chan struct{}, s.opts.PrepareConcurrency)
	for _, group := range byNode(vols) {
		if ctx.Err() != nil {
			break
		}
		slots <- struct{}{}
		prepared.Add(1)
		go func() {
			defer prepared.Done()
			defer func() { <-slots }()
			batch := s.prepareNode(ctx, sw, group, t, &tasks)
			// The node's volumes as one batch: the dispatcher orders them among themselves and
			// among the other nodes' lanes.
			s.opts.Dispatcher.Submit(batch...)
		}()
	}
	// Every task is counted in tasks once prepared is done, so the wait below sees them all.
	prepared.Wait()
	tasks.Wait()
	t.mu.Lock()
	defer t.mu.Unlock()
	summary := t.summary
	summary.Cancelled = ctx.Err() != nil
	if len(t.notes) > 0 {
		summary.Incomplete = strings.Join(t.notes, "; ")
	}
	return summary
}

// prepareNode decides the actions of one node's volumes and returns their tasks, each counted in
// tasks until its Done. A panic while preparing fails the node's remaining volumes, not the sweep.
func (s *Sweeper) prepareNode(ctx context.Context, sw scheduler.Sweep, vols []planner.Volume, t *tally, tasks *sync.WaitGroup) (batch []dispatch.Task) {
	batch = make([]dispatch.Task, 0, len(vols))
	next := 0
	defer func() {
		if r := recover(); r != nil {
			s.opts.Metrics.sweepPanicked(sw.Trigger)
			klog.FromContext(ctx).Error(nil, "Preparing a volume panicked; the node's remaining volumes fail",
				"pv", vols[next].PVName, "node", vols[next].NodeName, "panic", r, "stack", string(debug.Stack()))
			for _, v := range vols[next:] {
				t.add(v, outcomeFailed)
			}
			t.note(fmt.Sprintf("preparing volume %s panicked: %v", vols[next].PVName, r))
		}
	}()
	if target, node, err := s.opts.Targets.Target(vols[0].Driver, vols[0].NodeName); err != nil {
		t.note(fmt.Sprintf("no usable sidecar of %s on node %s: %v", vols[0].Driver, vols[0].NodeName, err))
	} else if caps, err := s.opts.Sidecars.Capabilities(ctx, target); err == nil {
		// The volumes below ask again and find the answer cached; a failure is theirs to report.
		s.publishTier(ctx, node, caps)
	}
	for ; next < len(vols); next++ {
		v := vols[next]
		if ctx.Err() != nil {
			return batch
		}
		w, task, o := s.prepare(ctx, sw, v)
		if w == nil {
			t.add(v, o)
			continue
		}
		w.tally, w.tasks = t, tasks
		task.Run, task.Done = w.run, w.done
		tasks.Add(1)
		batch = append(batch, task)
	}
	return batch
}

// byNode splits vols by driver and node, keeping the planner's order within and between nodes.
// The planner sorts by node, so a node's volumes are usually one run of vols, handed out as a
// part of vols rather than copied; only when a driver and node come back after another's (a
// sweep over several drivers) are the groups gathered in new slices.
func byNode(vols []planner.Volume) [][]planner.Volume {
	var groups [][]planner.Volume
	seen := map[[2]string]bool{}
	start := 0
	for i := range vols {
		if i > start && (vols[i].Driver != vols[start].Driver || vols[i].NodeName != vols[start].NodeName) {
			groups = append(groups, vols[start:i:i])
			start = i
		}
		if i == start {
			key := [2]string{vols[i].Driver, vols[i].NodeName}
			if seen[key] {
				return byNodeGathered(vols)
			}
			seen[key] = true
		}
	}
	if start < len(vols) {
		groups = append(groups, vols[start:len(vols):len(vols)])
	}
	return groups
}

// byNodeGathered is byNode for volumes whose drivers and nodes are not in runs.
func byNodeGathered(vols []planner.Volume) [][]planner.Volume {
	index := map[[2]string]int{}
	var groups [][]planner.Volume
	for _, v := range vols {
		key := [2]string{v.Driver, v.NodeName}
		i, ok := index[key]
		if !ok {
			i = len(groups)
			index[key] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], v)
	}
	return groups
}
