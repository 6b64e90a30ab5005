package scale

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/scheduler/dispatch"
)

// dispatchStorm is a rollout storm at the envelope's size through the controller's dispatcher
// (scheduler/dispatch, as the controller configures it), in this process: every node's restart
// sweep submitted at once, each volume one call that sleeps for the call time. The calls count
// for themselves how many are in flight, in all, per node and per volume, so that a budget the
// dispatcher failed to hold shows whatever its own statistics say.
type dispatchStorm struct {
	Nodes          int `json:"nodes"`
	VolumesPerNode int `json:"volumesPerNode"`
	Global         int `json:"budgetGlobal"`
	PerDriver      int `json:"budgetPerDriver"`
	PerNode        int `json:"budgetPerNode"`
	// CallSeconds is what each call asks to sleep; MeanCallSeconds what the calls measured.
	CallSeconds     float64 `json:"callSeconds"`
	MeanCallSeconds float64 `json:"meanCallSeconds"`
	// Seconds runs from the first submission to the last call's end.
	Seconds float64 `json:"seconds"`
	// IdealSeconds is the budget-bound finish: the calls' measured time divided by the budget
	// that binds (the smaller of the global and the driver's; every node's own calls take far
	// less), as if a slot never stood idle. NominalIdealSeconds takes the asked call time.
	IdealSeconds        float64 `json:"idealSeconds"`
	NominalIdealSeconds float64 `json:"nominalIdealSeconds"`
	// Efficiency is IdealSeconds / Seconds.
	Efficiency float64 `json:"efficiency"`
	// Calls counts the calls made; every volume once.
	Calls int64 `json:"calls"`
	// Max... are the most calls the calls saw in flight at once; Violations counts calls that
	// started over a budget (by the calls' own count or the dispatcher's statistics).
	MaxInFlight          int64 `json:"maxInFlight"`
	MaxInFlightPerNode   int64 `json:"maxInFlightPerNode"`
	MaxInFlightPerVolume int64 `json:"maxInFlightPerVolume"`
	Violations           int64 `json:"violations"`
	// CPUSeconds is this process's CPU time during the storm: the dispatcher's and the calls'
	// (sleeping) goroutines, on a machine that also runs other work.
	CPUSeconds float64 `json:"cpuSeconds"`
	// DispatcherStats is the dispatcher's own account at the end.
	DispatcherStats dispatch.Stats `json:"dispatcherStats"`
}

// runDispatchStorm submits nodes x perNode tasks of one driver, each one call of callTime, to a
// dispatcher with the given budgets and waits for every call.
func runDispatchStorm(ctx context.Context, nodes, perNode int, opts dispatch.Options, callTime time.Duration) (dispatchStorm, error) {
	out := dispatchStorm{Nodes: nodes, VolumesPerNode: perNode, Global: opts.Global, PerDriver: opts.PerDriver, PerNode: opts.PerNode,
		CallSeconds: callTime.Seconds()}
	d, err := dispatch.New(opts)
	if err != nil {
		return out, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- d.Start(ctx) }()

	total := nodes * perNode
	var inFlight, maxInFlight, maxPerNode, maxPerVolume, violations, calls, inCalls atomic.Int64
	perNodeCount := make([]atomic.Int64, nodes)
	perVolumeCount := make([]atomic.Int64, total)
	raise := func(m *atomic.Int64, v int64) {
		for {
			cur := m.Load()
			if v <= cur || m.CompareAndSwap(cur, v) {
				return
			}
		}
	}
	budget := int64(min(opts.Global, opts.PerDriver))
	var wg sync.WaitGroup
	wg.Add(total)
	var failed atomic.Pointer[error]
	done := func(r dispatch.Result) {
		if r.Err != nil {
			err := r.Err
			failed.CompareAndSwap(nil, &err)
		}
		wg.Done()
	}
	sweeps := make([][]dispatch.Task, nodes)
	for n := range sweeps {
		node := fmt.Sprintf("node-%04d", n)
		sweeps[n] = make([]dispatch.Task, perNode)
		for v := range perNode {
			vol := n*perNode + v
			sweeps[n][v] = dispatch.Task{
				Volume: fmt.Sprintf("pvc-%04d-%02d", n, v), Driver: driverName, Node: node, Trigger: scheduler.TriggerRestart, Done: done,
				Run: func(context.Context) error {
					g, nn, vv := inFlight.Add(1), perNodeCount[n].Add(1), perVolumeCount[vol].Add(1)
					raise(&maxInFlight, g)
					raise(&maxPerNode, nn)
					raise(&maxPerVolume, vv)
					if g > budget || nn > int64(opts.PerNode) || vv > 1 {
						violations.Add(1)
					}
					start := time.Now()
					time.Sleep(callTime)
					inCalls.Add(int64(time.Since(start)))
					perVolumeCount[vol].Add(-1)
					perNodeCount[n].Add(-1)
					inFlight.Add(-1)
					calls.Add(1)
					return nil
				},
			}
		}
	}
	runtime.GC()
	cpu0, err := cpuTime()
	if err != nil {
		return out, err
	}
	start := time.Now()
	for _, sweep := range sweeps {
		d.Submit(sweep...)
	}
	wg.Wait()
	out.Seconds = time.Since(start).Seconds()
	cpu1, err := cpuTime()
	if err != nil {
		return out, err
	}
	out.CPUSeconds = (cpu1 - cpu0).Seconds()
	cancel()
	if err := <-stopped; err != nil {
		return out, err
	}
	if p := failed.Load(); p != nil {
		return out, fmt.Errorf("a call of the storm failed: %w", *p)
	}
	out.DispatcherStats = d.Stats()
	s := out.DispatcherStats
	if s.MaxInFlight > opts.Global || s.MaxInFlightPerDriver > opts.PerDriver || s.MaxInFlightPerNode > opts.PerNode || s.MaxInFlightPerVolume > 1 {
		violations.Add(1)
	}
	out.Calls = calls.Load()
	out.MaxInFlight, out.MaxInFlightPerNode, out.MaxInFlightPerVolume = maxInFlight.Load(), maxPerNode.Load(), maxPerVolume.Load()
	out.Violations = violations.Load()
	out.MeanCallSeconds = float64(inCalls.Load()) / 1e9 / float64(out.Calls)
	out.IdealSeconds = float64(inCalls.Load()) / 1e9 / float64(budget)
	out.NominalIdealSeconds = float64(total) * callTime.Seconds() / float64(budget)
	out.Efficiency = out.IdealSeconds / out.Seconds
	return out, nil
}
