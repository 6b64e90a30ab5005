package scale

// The rollout storm of figure 3: every node plugin restarts at once, and the controller works off
// the restart sweeps under its budgets; the ideal finish it is measured against, and the pollers
// that sample the dispatcher while it runs.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"sync"
	"time"

	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/test/harness"
)

// measureStorm restarts every node plugin at once and watches the controller work off the
// restart sweeps under its budgets.
func (h *runner) measureStorm(ctx context.Context) error {
	l := h.layout
	h.calls.delay.Store(int64(l.CallDelay))
	defer h.calls.delay.Store(0)
	for _, p := range h.plugins {
		p.calls.reset()
	}
	h.calls.reset()
	m0, err := harness.ScrapeMetrics(ctx, h.ctrl.MetricsAddr)
	if err != nil {
		return err
	}
	c0, s0 := h.ctrl.stats.snapshot(), h.handledPatches()
	ctrlCPU0, err := processCPU(h.ctrl.Pid())
	if err != nil {
		return err
	}
	selfCPU0, err := cpuTime()
	if err != nil {
		return err
	}
	var profile string
	if l.Profile {
		profile = filepath.Join(h.dir, "storm-harness.pprof")
		f, err := os.Create(profile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
			return err
		}
		defer f.Close()
	}
	sampler := startSampler(h.calls, 5*time.Millisecond)
	dispatch := startDispatchPoller(ctx, h.ctrl.MetricsAddr, 200*time.Millisecond)
	var ctrlProfile string
	ctrlProfiled := make(chan error, 1)
	if l.ControllerProfile > 0 {
		ctrlProfile = filepath.Join(h.dir, "storm-controller.pprof")
		go func() { ctrlProfiled <- h.ctrl.cpuProfile(ctx, l.ControllerProfile, ctrlProfile) }()
	}

	h.logf("storm: restarting %d node plugins (%d volumes), call delay %s, budgets %d/%d/%d, debounce %s",
		len(h.plugins), h.volumes(), l.CallDelay, l.Global, l.PerDriver, l.PerNode, l.StormDebounce)
	restartTimes := make([]float64, len(h.plugins))
	// The plugins run on with ctx, not with forEach's context, which ends when forEach returns.
	if err := forEach(ctx, len(h.plugins), 64, func(_ context.Context, i int) error {
		start := time.Now()
		err := h.plugins[i].restart(ctx)
		restartTimes[i] = time.Since(start).Seconds()
		return err
	}); err != nil {
		sampler.stop()
		dispatch.stop()
		return err
	}
	var firstMarker, lastMarker time.Time
	for _, p := range h.plugins {
		t := p.markerAccepted()
		if firstMarker.IsZero() || t.Before(firstMarker) {
			firstMarker = t
		}
		lastMarker = later(lastMarker, t)
	}
	deadline := time.Now().Add(15 * time.Minute)
	var allProbed, allHandled time.Time
	for allProbed.IsZero() || allHandled.IsZero() {
		if allHandled.IsZero() && h.handledPatches()-s0 >= int64(len(h.plugins)) {
			allHandled = time.Now()
		}
		if allProbed.IsZero() {
			done := true
			for _, p := range h.plugins {
				if p.calls.snapshot().probed < len(p.vols) {
					done = false
					break
				}
			}
			if done {
				allProbed = time.Now()
			}
		}
		if time.Now().After(deadline) {
			sampler.stop()
			dispatch.stop()
			return fmt.Errorf("storm not worked off within 15m (probed: %t, handled: %t; controller log %s)", !allProbed.IsZero(), !allHandled.IsZero(), h.ctrl.LogPath)
		}
		time.Sleep(20 * time.Millisecond)
	}
	samples := sampler.stop()
	polled := dispatch.stop()
	if l.Profile {
		pprof.StopCPUProfile()
	}
	ctrlCPU1, err := processCPU(h.ctrl.Pid())
	if err != nil {
		return err
	}
	selfCPU1, err := cpuTime()
	if err != nil {
		return err
	}
	m1, err := harness.ScrapeMetrics(ctx, h.ctrl.MetricsAddr)
	if err != nil {
		return err
	}

	g := h.calls
	firstProbe, lastEnd := time.Unix(0, g.firstStart.Load()), time.Unix(0, g.lastEnd.Load())
	s := &storm{
		Nodes: len(h.plugins), Volumes: h.volumes(), Global: l.Global, PerDriver: l.PerDriver, PerNode: l.PerNode,
		DebounceSeconds: l.StormDebounce.Seconds(), CallDelayMs: ms(l.CallDelay),
		Probes: g.probes.Load(), Heals: g.heals.Load(),
		MaxInFlight:          g.maxInFlight.Load(),
		RolloutSeconds:       lastMarker.Sub(firstMarker).Seconds(),
		FirstProbeSeconds:    firstProbe.Sub(firstMarker).Seconds(),
		FinishSeconds:        lastEnd.Sub(firstMarker).Seconds(),
		DispatchSeconds:      lastEnd.Sub(firstProbe).Seconds(),
		HandledSeconds:       allHandled.Sub(firstMarker).Seconds(),
		ControllerCPUSeconds: (ctrlCPU1 - ctrlCPU0).Seconds(),
		HarnessCPUSeconds:    (selfCPU1 - selfCPU0).Seconds(),
		ControllerRequests:   figureOf(h.ctrl.stats.snapshot().since(c0), 1),
	}
	if calls := g.calls.Load(); calls > 0 {
		s.MeanDriverCallMs = float64(g.callNanos.Load()) / float64(calls) / 1e6
	}
	cnt0, sum0 := harness.HistogramSums(m0, "volume_healer_call_duration_seconds", map[string]string{"operation": "probe"})
	cnt1, sum1 := harness.HistogramSums(m1, "volume_healer_call_duration_seconds", map[string]string{"operation": "probe"})
	if cnt1 > cnt0 {
		s.MeanControllerCallMs = (sum1 - sum0) / float64(cnt1-cnt0) * 1000
	}
	s.IdealSeconds = float64(g.callNanos.Load()) / 1e9 / float64(l.Global)
	if s.FinishSeconds > 0 {
		s.Efficiency = s.IdealSeconds / s.FinishSeconds
	}
	if s.DispatchSeconds > 0 {
		s.DispatchEfficiency = s.IdealSeconds / s.DispatchSeconds
	}
	var sum float64
	var n int
	for _, smp := range samples {
		if !smp.at.Before(firstProbe) && !smp.at.After(lastEnd) {
			sum += float64(smp.inFlight)
			n++
		}
	}
	if n > 0 {
		s.MeanInFlight = sum / float64(n)
		s.Utilization = s.MeanInFlight / float64(l.Global)
	}
	s.RestartP50Seconds, s.RestartMaxSeconds = percentile(restartTimes, 50), percentile(restartTimes, 100)
	// The best any dispatcher could do with these budgets, given when each node's work arrived
	// (its marker: each node's plugin restarts once, and the controller sweeps a lone restart at
	// once; the debounce spaces only the sweeps of restarts that follow one another) and the
	// drivers' mean call time.
	var arrivals []nodeArrival
	var lags []float64
	for _, p := range h.plugins {
		arrivals = append(arrivals, nodeArrival{ready: p.markerAccepted(), tasks: len(p.vols)})
		if at, end := h.ctrl.handledAt(sidecar.DefaultCSIAddonsNodeName(p.name, driverName)), p.calls.snapshot().lastEnd; !at.IsZero() && !end.IsZero() {
			lags = append(lags, at.Sub(end).Seconds())
		}
	}
	if s.MeanDriverCallMs > 0 {
		call := time.Duration(s.MeanDriverCallMs * float64(time.Millisecond))
		s.ArrivalIdealSeconds = idealFinish(arrivals, call, l.Global, l.PerNode, false).Sub(firstMarker).Seconds()
		s.ArrivalTakingTurnsSeconds = idealFinish(arrivals, call, l.Global, l.PerNode, true).Sub(firstMarker).Seconds()
		if s.FinishSeconds > 0 {
			s.ArrivalEfficiency = s.ArrivalIdealSeconds / s.FinishSeconds
		}
	}
	s.HandledLagP50Seconds, s.HandledLagMaxSeconds = percentile(lags, 50), percentile(lags, 100)
	// Each node's sweep on the storm's clock, and how long the last node ran alone at the end.
	var ends []float64
	for _, p := range h.plugins {
		snap := p.calls.snapshot()
		t := stormNode{Name: p.name, Volumes: len(p.vols), MarkerSeconds: p.markerAccepted().Sub(firstMarker).Seconds(),
			FirstProbeSeconds: snap.firstProbe.Sub(firstMarker).Seconds(), LastProbeEndSeconds: snap.lastEnd.Sub(firstMarker).Seconds()}
		s.NodeTimeline = append(s.NodeTimeline, t)
		ends = append(ends, t.LastProbeEndSeconds)
		if t.LastProbeEndSeconds >= s.FinishSeconds-1e-6 {
			s.LastNode, s.LastNodeVolumes = t.Name, t.Volumes
		}
	}
	sort.Float64s(ends)
	if len(ends) > 1 {
		s.TailSeconds = ends[len(ends)-1] - ends[len(ends)-2]
	}
	// While tasks were queued, the dispatcher had work for every slot: how busy were the slots
	// then, as the controller counts them and as the drivers see them?
	var ctrlSum, drvSum float64
	var ctrlN, drvN int
	for i := 0; i+1 < len(polled); i++ {
		if polled[i].queued <= 0 {
			continue
		}
		s.BacklogSeconds += polled[i+1].at.Sub(polled[i].at).Seconds()
		ctrlSum += polled[i].inFlight
		ctrlN++
		for _, smp := range samples {
			if !smp.at.Before(polled[i].at) && smp.at.Before(polled[i+1].at) {
				drvSum += float64(smp.inFlight)
				drvN++
			}
		}
	}
	if ctrlN > 0 {
		s.BacklogControllerUtilization = ctrlSum / float64(ctrlN) / float64(l.Global)
	}
	if drvN > 0 {
		s.BacklogDriverUtilization = drvSum / float64(drvN) / float64(l.Global)
	}
	for _, p := range h.plugins {
		snap := p.calls.snapshot()
		s.MaxInFlightPerNode = max(s.MaxInFlightPerNode, snap.maxInFlight)
		s.MaxInFlightPerVolume = max(s.MaxInFlightPerVolume, snap.maxPerVolume)
		s.VolumesProbed += snap.probed
		dc := p.Driver().Counters()
		s.DriverMaxConcurrentPerNode = max(s.DriverMaxConcurrentPerNode, dc.MaxConcurrent)
		for _, v := range dc.MaxConcurrentPerVolume {
			s.DriverMaxConcurrentPerVolume = max(s.DriverMaxConcurrentPerVolume, v)
		}
	}
	if s.MaxInFlight > int64(l.Global) {
		s.BudgetViolations++
	}
	if s.MaxInFlightPerNode > l.PerNode || s.DriverMaxConcurrentPerNode > int64(l.PerNode) {
		s.BudgetViolations++
	}
	if s.MaxInFlightPerVolume > 1 || s.DriverMaxConcurrentPerVolume > 1 {
		s.BudgetViolations++
	}
	if s.ControllerRSSBytes, _, s.ControllerHeapBytes, err = h.ctrl.memory(ctx, 1); err != nil {
		return err
	}
	if profile != "" {
		if s.ProfileTop, err = pprofTop(profile, 25); err != nil {
			return err
		}
	}
	if ctrlProfile != "" {
		if err := <-ctrlProfiled; err != nil {
			return err
		}
		if s.ControllerProfileTop, err = pprofTop(ctrlProfile, 30); err != nil {
			return err
		}
		if s.ControllerProfileTopCum, err = pprofTop(ctrlProfile, 30, "-cum"); err != nil {
			return err
		}
	}
	h.res.Storm = s
	h.logf("storm: %d volumes on %d nodes: rollout %.1fs, first probe %.1fs, finished %.1fs after the first marker (dispatch %.1fs, ideal %.1fs: efficiency %.0f%%, dispatch efficiency %.0f%%), handled %.1fs; max in flight %d/%d, per node %d, per volume %d; controller CPU %.1fs",
		s.Volumes, s.Nodes, s.RolloutSeconds, s.FirstProbeSeconds, s.FinishSeconds, s.DispatchSeconds, s.IdealSeconds, 100*s.Efficiency, 100*s.DispatchEfficiency,
		s.HandledSeconds, s.MaxInFlight, l.Global, s.MaxInFlightPerNode, s.MaxInFlightPerVolume, s.ControllerCPUSeconds)
	return nil
}

// nodeArrival is when a node's restart sweep releases its tasks, and how many.
type nodeArrival struct {
	ready time.Time
	tasks int
}

// idealFinish simulates a dispatcher that never leaves a slot idle while a task could use it,
// with a global and a per-node budget and calls that all take call, in 1ms steps. With fair
// unset it starts the nodes with the most work left first, which gives the shortest finish;
// with fair set the nodes take turns, one task each per pass, as the controller's dispatcher
// did between equals before it ranked lanes by their queued work. It returns when the last call would end.
func idealFinish(nodes []nodeArrival, call time.Duration, global, perNode int, fair bool) time.Time {
	if len(nodes) == 0 {
		return time.Time{}
	}
	start := nodes[0].ready
	for _, n := range nodes {
		if n.ready.Before(start) {
			start = n.ready
		}
	}
	type state struct {
		ready   time.Duration
		pending int
		running []time.Duration // end times
	}
	st := make([]*state, len(nodes))
	left := 0
	for i, n := range nodes {
		st[i] = &state{ready: n.ready.Sub(start), pending: n.tasks}
		left += n.tasks
	}
	const step = time.Millisecond
	var last time.Duration
	inFlight, turn := 0, 0
	order := make([]*state, len(st))
	copy(order, st)
	for now := time.Duration(0); left > 0 || inFlight > 0; now += step {
		for _, n := range st {
			kept := n.running[:0]
			for _, end := range n.running {
				if end <= now {
					inFlight--
					last = max(last, end)
					continue
				}
				kept = append(kept, end)
			}
			n.running = kept
		}
		if inFlight >= global || left == 0 {
			continue
		}
		canStart := func(n *state) bool {
			return n.ready <= now && n.pending > 0 && len(n.running) < perNode && inFlight < global
		}
		startOne := func(n *state) {
			n.running = append(n.running, now+call)
			n.pending--
			left--
			inFlight++
		}
		if !fair {
			sort.Slice(order, func(i, j int) bool { return order[i].pending > order[j].pending })
			for _, n := range order {
				for canStart(n) {
					startOne(n)
				}
			}
			continue
		}
		for started := true; started && inFlight < global; {
			started = false
			for i := range st {
				n := st[(turn+i)%len(st)]
				if canStart(n) {
					startOne(n)
					started = true
				}
			}
			turn++
		}
	}
	return start.Add(last)
}

// dispatchSample is the controller's dispatcher as its metrics show it at one moment.
type dispatchSample struct {
	at               time.Time
	queued, inFlight float64
}

// dispatchPoller reads the controller's dispatcher gauges at a fixed interval.
type dispatchPoller struct {
	stopc   chan struct{}
	wg      sync.WaitGroup
	samples []dispatchSample
}

func startDispatchPoller(ctx context.Context, addr string, every time.Duration) *dispatchPoller {
	p := &dispatchPoller{stopc: make(chan struct{})}
	p.wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.stopc:
				return
			case <-t.C:
			}
			m, err := harness.ScrapeMetrics(ctx, addr)
			if err != nil {
				continue
			}
			p.samples = append(p.samples, dispatchSample{at: time.Now(),
				queued: harness.MetricSum(m, "volume_healer_dispatch_queued", nil), inFlight: harness.MetricSum(m, "volume_healer_dispatch_in_flight", nil)})
		}
	})
	return p
}

func (p *dispatchPoller) stop() []dispatchSample {
	close(p.stopc)
	p.wg.Wait()
	return p.samples
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

type inFlightSample struct {
	at       time.Time
	inFlight int64
}

// sampler reads the calls in flight at the drivers at a fixed interval.
type sampler struct {
	stopc   chan struct{}
	wg      sync.WaitGroup
	samples []inFlightSample
}

func startSampler(g *callStats, every time.Duration) *sampler {
	s := &sampler{stopc: make(chan struct{})}
	s.wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-s.stopc:
				return
			case now := <-t.C:
				s.samples = append(s.samples, inFlightSample{at: now, inFlight: g.inFlight.Load()})
			}
		}
	})
	return s
}

func (s *sampler) stop() []inFlightSample {
	close(s.stopc)
	s.wg.Wait()
	return s.samples
}
