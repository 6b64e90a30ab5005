package dispatch

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// stormNode is one node of a simulated rollout.
type stormNode struct {
	// volumes are spread over drivers CSI drivers; zero drivers means one.
	volumes, drivers int
}

// stormResult is what a simulated rollout took.
type stormResult struct {
	// rounds is how many call times the rollout took: every call takes exactly one.
	rounds int
	// ideal is the budget-bound ideal in rounds: the calls over the global budget, or the biggest
	// node's calls over its per-node budget if that is longer.
	ideal int
	stats Stats
}

// rounds plays calls out in rounds, each call taking exactly one: every call in flight ends, one
// after the other in a fixed order, and the calls the dispatcher starts meanwhile make up the next
// round. It tells a rollout in call times rather than on a clock, the same way on every run.
type rounds struct {
	t        *testing.T
	d        *Dispatcher
	mu       sync.Mutex
	running  map[string]chan struct{}
	finished chan string
	// count is the number of rounds started.
	count int
}

func newRounds(t *testing.T, d *Dispatcher) *rounds {
	return &rounds{t: t, d: d, running: map[string]chan struct{}{}, finished: make(chan string, 1)}
}

// task returns a restart task whose call lasts until its round ends; then, if set, runs before the
// task reports its end.
func (r *rounds) task(name, driver, node string, then func()) Task {
	return Task{Volume: name, Driver: driver, Node: node, Trigger: scheduler.TriggerRestart,
		Run: func(ctx context.Context) error {
			release := make(chan struct{})
			r.mu.Lock()
			r.running[name] = release
			r.mu.Unlock()
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
		Done: func(res Result) {
			if res.Err != nil {
				// The dispatcher stopped: nobody reads finished. After a failure, that is the test
				// giving up, and every queued task saying so adds nothing.
				if !r.t.Failed() {
					r.t.Errorf("%s: %v", name, res.Err)
				}
				return
			}
			if then != nil {
				then()
			}
			r.finished <- name
		}}
}

// next waits until every call in flight is in its Run and returns them, sorted: the next round.
func (r *rounds) next() []string {
	r.t.Helper()
	var inFlight int
	poll.Eventually(r.t, settle, "calls in flight", poll.True(func() bool { inFlight = r.d.Stats().InFlight; return inFlight > 0 }))
	var batch []string
	poll.Eventually(r.t, settle, "the round's calls to start", poll.True(func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.running) < inFlight {
			return false
		}
		batch = batch[:0]
		for name := range r.running {
			batch = append(batch, name)
		}
		return true
	}))
	slices.Sort(batch)
	r.count++
	return batch
}

// end ends the calls of a round one after the other, each once the previous one has been settled
// and the calls it made room for have been started.
func (r *rounds) end(batch []string) {
	r.t.Helper()
	for _, name := range batch {
		r.mu.Lock()
		release := r.running[name]
		delete(r.running, name)
		r.mu.Unlock()
		close(release)
		select {
		case got := <-r.finished:
			if got != name {
				r.t.Fatalf("round %d: %s ended when %s was released", r.count, got, name)
			}
		case <-time.After(10 * time.Second):
			r.t.Fatalf("round %d: %s did not end", r.count, name)
		}
	}
}

// simulateStorm submits every node's restart sweep at once and plays the calls out in rounds.
func simulateStorm(t *testing.T, opts Options, nodes []stormNode) stormResult {
	t.Helper()
	// Should the test give up, calls still waiting for their round end at once.
	opts.ShutdownGrace = time.Millisecond
	d, _ := runDispatcher(t, opts)
	r := newRounds(t, d)
	var tasks []Task
	biggest := 0
	for n, node := range nodes {
		drivers := max(node.drivers, 1)
		biggest = max(biggest, node.volumes)
		for v := range node.volumes {
			tasks = append(tasks, r.task(fmt.Sprintf("pv-%03d-%03d", n, v), fmt.Sprintf("driver-%d", v%drivers), fmt.Sprintf("node-%03d", n), nil))
		}
	}
	d.Submit(tasks...)
	for done := 0; done < len(tasks); {
		batch := r.next()
		r.end(batch)
		done += len(batch)
	}
	return stormResult{
		rounds: r.count,
		ideal:  max(ceilDiv(len(tasks), opts.Global), ceilDiv(biggest, opts.PerNode)),
		stats:  d.Stats(),
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// TestDispatchStormFinishesNearTheIdeal plays a DaemonSet rollout in which every node plugin
// restarts at once and checks that it ends within 15 % of the budget-bound ideal, without
// exceeding a budget: a node with far more volumes than the others must not be left to run alone
// at the end with the global budget mostly idle.
func TestDispatchStormFinishesNearTheIdeal(t *testing.T) {
	repeat := func(n int, node stormNode) []stormNode {
		out := make([]stormNode, n)
		for i := range out {
			out[i] = node
		}
		return out
	}
	tests := map[string]struct {
		opts  Options
		nodes []stormNode
	}{
		// 400 calls through 16 slots: 25 rounds, and the big node needs all 25 at 4 slots.
		"one node with ten times the others' volumes": {
			opts:  Options{Global: 16, PerDriver: 16, PerNode: 4},
			nodes: append([]stormNode{{volumes: 100}}, repeat(30, stormNode{volumes: 10})...),
		},
		// The big node's volumes are split over two drivers, each with fewer than the small nodes.
		"the big node's volumes over two drivers": {
			opts:  Options{Global: 16, PerDriver: 16, PerNode: 4},
			nodes: append([]stormNode{{volumes: 100, drivers: 2}}, repeat(30, stormNode{volumes: 10})...),
		},
		// The per-driver budget binds before the global one.
		"per-driver budget below the global": {
			opts:  Options{Global: 32, PerDriver: 16, PerNode: 4},
			nodes: append([]stormNode{{volumes: 100}}, repeat(30, stormNode{volumes: 10})...),
		},
		"equal nodes, as in BenchmarkDispatchStorm": {
			opts:  Options{Global: 16, PerDriver: 16, PerNode: 4},
			nodes: repeat(40, stormNode{volumes: 20}),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			res := simulateStorm(t, tc.opts, tc.nodes)
			// With PerDriver below Global and one driver, the driver's budget is the global one.
			if tc.opts.PerDriver < tc.opts.Global {
				total := 0
				for _, n := range tc.nodes {
					total += n.volumes
				}
				res.ideal = max(res.ideal, ceilDiv(total, tc.opts.PerDriver))
			}
			efficiency := float64(res.ideal) / float64(res.rounds)
			t.Logf("finished in %d rounds, ideal %d: %.0f%% efficiency", res.rounds, res.ideal, 100*efficiency)
			if limit := int(math.Floor(1.15 * float64(res.ideal))); res.rounds > limit {
				t.Errorf("finished in %d rounds; want at most %d (1.15 x the ideal %d)", res.rounds, limit, res.ideal)
			}
			s := res.stats
			if s.MaxInFlight > tc.opts.Global || s.MaxInFlightPerDriver > tc.opts.PerDriver || s.MaxInFlightPerNode > tc.opts.PerNode || s.MaxInFlightPerVolume > 1 {
				t.Errorf("budget exceeded: %+v", s)
			}
		})
	}
}

// TestDispatchServesSmallNodeWhileBigNodeHasWork fills the whole global budget with one node's
// work and keeps it topped up, as sweeps that keep coming would: a node with one volume must
// still get its call, within the bound laneLess promises (as many rounds as the big node's queue
// takes at its full per-node budget), not only once the big node runs dry.
func TestDispatchServesSmallNodeWhileBigNodeHasWork(t *testing.T) {
	const bigVolumes = 200
	opts := Options{Global: 4, PerDriver: 4, PerNode: 4, ShutdownGrace: time.Millisecond}
	d, _ := runDispatcher(t, opts)
	r := newRounds(t, d)

	// Each of the big node's tasks submits itself again when it ends, until refilling stops.
	refill := true
	var bigTask func(v int) Task
	bigTask = func(v int) Task {
		return r.task(fmt.Sprintf("pv-big-%03d", v), "rbd", "node-big", func() {
			if refill {
				d.Submit(bigTask(v))
			}
		})
	}
	var tasks []Task
	for v := range bigVolumes {
		tasks = append(tasks, bigTask(v))
	}
	d.Submit(tasks...)
	// Two passes over the big node's volumes first, so that it is in its steady state.
	for range 2 * bigVolumes / opts.Global {
		r.end(r.next())
	}

	d.Submit(r.task("pv-small", "rbd", "node-small", nil))
	submitted := r.count
	for {
		batch := r.next()
		if slices.Contains(batch, "pv-small") {
			break
		}
		if r.count-submitted > 4*bigVolumes {
			t.Fatalf("the small node was not served in %d rounds while the big node had work", r.count-submitted)
		}
		r.end(batch)
	}
	waited := r.count - submitted - 1
	// Let the big node run dry, so that no call is left waiting for its round.
	refill = false
	for r.d.Stats().InFlight > 0 {
		r.end(r.next())
	}

	// The bound: the big node's queue (all its volumes but the calls in flight) at its per-node
	// budget, and the round in which the small task's lane overtakes.
	bound := bigVolumes/opts.PerNode + 1
	t.Logf("the small node was served after %d rounds of the big node's calls (bound %d)", waited, bound)
	if waited > bound {
		t.Errorf("the small node waited %d rounds; want at most %d", waited, bound)
	}
}
