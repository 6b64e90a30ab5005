package dispatch

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/scheduler"
)

// BenchmarkDispatchStorm is a DaemonSet rollout: every node plugin of one driver restarts at once
// and each node's restart sweep submits its volumes in one call. It reports the tasks dispatched
// per second and, for calls that take time, the efficiency against the budget-bound ideal: the
// time the storm would take with the global budget busy all the time (volumes x call time /
// global budget). It fails if any budget was exceeded.
//
// Shape: 200 nodes x 100 volumes, Global 64, PerNode 4. PerDriver is raised to the global budget
// so that the one driver does not bind first.
func BenchmarkDispatchStorm(b *testing.B) {
	const nodes, perNode = 200, 100
	opts := Options{Global: 64, PerDriver: 64, PerNode: 4}
	for _, callTime := range []time.Duration{0, time.Millisecond} {
		name := "instant-calls"
		if callTime > 0 {
			name = fmt.Sprintf("calls-of-%s", callTime)
		}
		b.Run(name, func(b *testing.B) {
			var inCalls atomic.Int64 // nanoseconds spent inside Run
			run := func(context.Context) error {
				if callTime == 0 {
					return nil
				}
				start := time.Now()
				time.Sleep(callTime)
				inCalls.Add(int64(time.Since(start)))
				return nil
			}
			var wg sync.WaitGroup
			done := func(r Result) {
				if r.Err != nil {
					b.Error(r.Err)
				}
				wg.Done()
			}
			sweeps := make([][]Task, nodes)
			for n := range sweeps {
				for v := 0; v < perNode; v++ {
					sweeps[n] = append(sweeps[n], Task{
						Volume: fmt.Sprintf("pvc-%03d-%03d", n, v), Driver: "rbd.csi.ceph.com",
						Node: fmt.Sprintf("node-%03d", n), Trigger: scheduler.TriggerRestart, Run: run, Done: done,
					})
				}
			}
			const total = nodes * perNode

			var storms time.Duration
			var stats Stats
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				d, err := New(opts)
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				stopped := make(chan error, 1)
				go func() { stopped <- d.Start(ctx) }()

				wg.Add(total)
				start := time.Now()
				for _, sweep := range sweeps {
					d.Submit(sweep...)
				}
				wg.Wait()
				storms += time.Since(start)

				cancel()
				if err := <-stopped; err != nil {
					b.Fatal(err)
				}
				stats = d.Stats()
				if stats.MaxInFlight > opts.Global || stats.MaxInFlightPerNode > opts.PerNode || stats.MaxInFlightPerVolume > 1 {
					b.Fatalf("budget exceeded: %+v", stats)
				}
			}
			b.StopTimer()

			calls := float64(b.N * total)
			b.ReportMetric(calls/storms.Seconds(), "tasks/s")
			b.ReportMetric(float64(storms.Nanoseconds())/calls, "ns/task")
			b.ReportMetric(float64(stats.MaxInFlight), "max-in-flight")
			if callTime > 0 {
				// The ideal takes the calls' measured length, which includes the sleep's own overshoot
				// on a busy machine; vs-nominal takes the length the calls asked for.
				perStorm := storms.Seconds() / float64(b.N)
				measured := float64(inCalls.Load()) / 1e9 / float64(b.N) / float64(opts.Global)
				nominal := float64(total) * callTime.Seconds() / float64(opts.Global)
				b.ReportMetric(measured/perStorm, "efficiency")
				b.ReportMetric(nominal/perStorm, "vs-nominal")
			}
		})
	}
}
