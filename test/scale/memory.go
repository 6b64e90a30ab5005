package scale

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/volume-healer/volume-healer/test/harness"
)

// templateVolumes are the volumes created through the API before a memory-only run writes the
// others into etcd: the etcd fill copies their managed fields and status, and needs a PV of each
// StorageClass (three in four volumes use rbd-nbd, see newVolumes).
const templateVolumes = 4

// RunMemory measures figure 4 alone: the controller's memory with the cluster filled, through
// etcd, to each of sizes (ascending), without node plugins, restarts or a storm. It takes the
// minutes the full run's first phases take off the points that need an hour of them.
func RunMemory(ctx context.Context, sizes []int, settle time.Duration, dir string, logf func(format string, args ...any)) (*Results, error) {
	start := time.Now()
	l := FullLayout()
	l.MemoryVolumes, l.Settle = sizes, settle
	res := &Results{Schema: resultsSchema, Mode: "memory", Started: start.UTC(), Layout: l, Machine: readMachine(runtime.Version(), runtime.NumCPU())}
	res.LoadAverage = loadAverage()
	h := &runner{layout: l, dir: dir, procs: harness.NewProcesses(), logf: logf, calls: &callStats{}, res: res}
	err := h.onCluster(ctx, h.measureMemoryOnly)
	res.WallSeconds = time.Since(start).Seconds()
	return res, err
}

func (h *runner) measureMemoryOnly(ctx context.Context) error {
	const node = "node-template"
	start := time.Now()
	if err := h.c.createNodes(ctx, []string{node}); err != nil {
		return err
	}
	if err := h.c.createVolumes(ctx, h.c.newVolumes(node, templateVolumes), templateVolumes, nil); err != nil {
		return err
	}
	took := time.Since(start)
	h.clusterVolumes, h.clusterNodes = templateVolumes, 1
	h.res.Setup = append(h.res.Setup, setupStep{Phase: "templates", Nodes: 1, Volumes: templateVolumes, Method: "api",
		Seconds: took.Seconds(), VolumesPerSec: templateVolumes / took.Seconds()})
	for i, size := range h.layout.MemoryVolumes {
		if extra := size - h.clusterVolumes; extra > 0 {
			if err := h.addVolumesOnly(ctx, extra); err != nil {
				return err
			}
		}
		if err := h.measureMemory(ctx, fmt.Sprintf("controller-%d", 1+i), h.layout.StormDebounce); err != nil {
			return err
		}
	}
	return nil
}
