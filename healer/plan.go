package healer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"

	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/scheduler/planner"
)

// plan selects the sweep's volumes from the caches, asking the sidecars only for drivers whose
// volumes have no VolumeAttachment.
func (s *Sweeper) plan(ctx context.Context, sw scheduler.Sweep) ([]planner.Volume, []planner.Skipped, error) {
	p := s.opts.Planner
	switch sw.Trigger {
	case scheduler.TriggerRestart:
		if p.AttachRequired(sw.Driver) {
			vols, skipped := p.NodeVolumes(sw.Driver, sw.Node)
			return vols, skipped, nil
		}
		return s.staged(ctx, sw.Driver, sw.Node, nil)
	default:
		if sw.PV != "" {
			driver, ok := p.PVDriver(sw.PV)
			if !ok || p.AttachRequired(driver) {
				vols, skipped := p.PVVolumes(sw.PV)
				return vols, skipped, nil
			}
			return s.stagedOnNodes(ctx, driver, func(pv string) bool { return pv == sw.PV })
		}
		if sw.StorageClass == "" && sw.Driver != "" && sw.Node != "" {
			if p.AttachRequired(sw.Driver) {
				vols, skipped := p.NodeVolumes(sw.Driver, sw.Node)
				return vols, skipped, nil
			}
			return s.staged(ctx, sw.Driver, sw.Node, nil)
		}
		vols, skipped := p.ClassVolumes(sw.StorageClass)
		inClass := func(pv string) bool { return p.InClass(pv, sw.StorageClass) }
		var errs []error
		for _, driver := range p.ClassDrivers(sw.StorageClass) {
			v, sk, err := s.stagedOnNodes(ctx, driver, inClass)
			vols, skipped = append(vols, v...), append(skipped, sk...)
			if err != nil {
				errs = append(errs, err)
			}
		}
		if sw.Node != "" || sw.Driver != "" {
			vols = filterVolumes(vols, func(v planner.Volume) bool {
				return (sw.Node == "" || v.NodeName == sw.Node) && (sw.Driver == "" || v.Driver == sw.Driver)
			})
		}
		return vols, skipped, errors.Join(errs...)
	}
}

// stagedOnNodes asks every sidecar of driver which volumes it has staged (see staged), at most
// Options.PrepareConcurrency nodes at once, as the nodes of a sweep are prepared: a sidecar that
// does not answer holds up its own node only, not every node after it. The volumes come back in
// the order of the nodes.
func (s *Sweeper) stagedOnNodes(ctx context.Context, driver string, keep func(pv string) bool) ([]planner.Volume, []planner.Skipped, error) {
	nodes := s.opts.Targets.Nodes(driver)
	type answer struct {
		vols    []planner.Volume
		skipped []planner.Skipped
		err     error
	}
	answers := make([]answer, len(nodes))
	slots := make(chan struct{}, s.opts.PrepareConcurrency)
	var wg sync.WaitGroup
	for i, node := range nodes {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			a := &answers[i]
			defer s.survive(ctx, goroutineStagedList, func(r any) {
				a.vols, a.skipped = nil, nil
				a.err = fmt.Errorf("the staged volumes of %s on node %s could not be listed: the listing panicked: %v", driver, node, r)
			})
			a.vols, a.skipped, a.err = s.staged(ctx, driver, node, keep)
		}()
	}
	wg.Wait()
	var vols []planner.Volume
	var skipped []planner.Skipped
	var errs []error
	for _, a := range answers {
		vols, skipped = append(vols, a.vols...), append(skipped, a.skipped...)
		if a.err != nil {
			errs = append(errs, a.err)
		}
	}
	return vols, skipped, errors.Join(errs...)
}

// goroutineStagedList names the goroutine that lists one node's staged volumes, in logs and in
// volume_healer_sweep_goroutine_panics_total.
const goroutineStagedList = "staged_list"

// goroutineStatusWrite names the goroutines that write the claims' status annotations and the
// Events that follow them (statusWrites).
const goroutineStatusWrite = "status_write"

// survive is deferred by a goroutine the sweeper starts, before its work: it recovers a panic,
// logs it with the goroutine's name, counts it and calls failed with the panic's value, so that
// the goroutine's work fails and the controller goes on, as the dispatcher does with a task that
// panics. It must be the deferred function itself: recover stops a panic only when called there.
func (s *Sweeper) survive(ctx context.Context, goroutine string, failed func(r any)) {
	r := recover()
	if r == nil {
		return
	}
	s.opts.Metrics.goroutinePanicked(goroutine)
	klog.FromContext(ctx).Error(nil, "Goroutine panicked; its work fails, the others go on", "goroutine", goroutine, "panic", r, "stack", string(debug.Stack()))
	failed(r)
}

// staged asks the sidecar of driver on node which volumes it has staged, restricted to the PVs
// that keep accepts when keep is set. Drivers without VolumeAttachments have no other list of a
// node's volumes: when the sidecar cannot answer, the error says that the node's volumes are
// unknown, and a restart sweep is not complete.
func (s *Sweeper) staged(ctx context.Context, driver, node string, keep func(pv string) bool) ([]planner.Volume, []planner.Skipped, error) {
	target, _, err := s.opts.Targets.Target(driver, node)
	var staged []probe.StagedVolume
	if err == nil {
		staged, err = s.opts.Sidecars.ListStaged(ctx, target)
		s.opts.Metrics.callError(driver, err)
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot list staged volumes", "driver", driver, "node", node)
		return nil, nil, fmt.Errorf("the staged volumes of %s on node %s could not be listed: %w", driver, node, err)
	}
	// The sidecar names the PVs it has read lately; the others are mapped here, by handle.
	var unnamed []string
	for _, v := range staged {
		if v.PV == "" && v.VolumeID != "" {
			unnamed = append(unnamed, v.VolumeID)
		}
	}
	byHandle := s.opts.Planner.PVNamesByHandle(driver, unnamed)
	var names []string
	for _, v := range staged {
		pv := v.PV
		if pv == "" {
			pv = byHandle[v.VolumeID]
		}
		if pv != "" && (keep == nil || keep(pv)) {
			names = append(names, pv)
		}
	}
	vols, skipped := s.opts.Planner.StagedVolumes(driver, node, names)
	return vols, skipped, nil
}

// filterVolumes keeps the volumes that keep accepts, in place.
func filterVolumes(vols []planner.Volume, keep func(planner.Volume) bool) []planner.Volume {
	out := vols[:0]
	for _, v := range vols {
		if keep(v) {
			out = append(out, v)
		}
	}
	return out
}
