package scale

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/scheduler/dispatch"
	"github.com/volume-healer/volume-healer/scheduler/planner"
	"github.com/volume-healer/volume-healer/sidecar"
)

// errNoCalls answers every sidecar call the planning measurement must not make.
var errNoCalls = errors.New("scale: no sidecar calls in the planning measurement")

// cachedCapabilities answers Capabilities from a map, as the probe client's capability cache does
// once warm, and makes no other call.
type cachedCapabilities struct {
	mu    sync.Mutex
	cache map[string]*probe.Capabilities
}

var _ healer.Sidecars = (*cachedCapabilities)(nil)

func (c *cachedCapabilities) Capabilities(_ context.Context, t probe.Target) (*probe.Capabilities, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := t.Driver + "/" + t.Node
	caps, ok := c.cache[key]
	if !ok {
		caps = &probe.Capabilities{Driver: t.Driver, Probe: true, Heal: true, Attributes: map[string]string{"healMounters": "rbd-nbd,fuse"}}
		c.cache[key] = caps
	}
	return caps, nil
}

func (c *cachedCapabilities) Probe(context.Context, probe.Target, string) (*probe.Result, error) {
	return nil, errNoCalls
}

func (c *cachedCapabilities) Heal(context.Context, probe.Target, string) (*probe.Result, error) {
	return nil, errNoCalls
}

func (c *cachedCapabilities) ListStaged(context.Context, probe.Target) ([]probe.StagedVolume, error) {
	return nil, errNoCalls
}

func (c *cachedCapabilities) Refresh(string, string) {}

// finishingDispatcher ends every task at once, without running it: the measurement stops where
// the real dispatcher would start calling.
type finishingDispatcher struct{ tasks atomic.Int64 }

func (d *finishingDispatcher) Submit(tasks ...dispatch.Task) {
	d.tasks.Add(int64(len(tasks)))
	for _, t := range tasks {
		if t.Done != nil {
			t.Done(dispatch.Result{})
		}
	}
}

// noClient is a client that a periodic sweep of healthy volumes uses only to record the tier of
// each driver on each node on its CSIAddonsNode, once; any other call panics (a nil Client).
type noClient struct{ client.Client }

// Patch accepts the sweep's write of a driver's tier.
func (noClient) Patch(context.Context, client.Object, client.Patch, ...client.PatchOption) error {
	return nil
}

// sweepCPU is the cost of one periodic sweep over every volume, planning and policy only.
type sweepCPU struct {
	// Policy names the policy: "built-in", or "teams" (teamPolicy, which reads the claim's
	// namespace and labels).
	Policy         string `json:"policy"`
	Volumes        int    `json:"volumes"`
	Nodes          int    `json:"nodes"`
	StorageClasses int    `json:"storageClasses"`
	// Namespaces are the claims' namespaces.
	Namespaces     int     `json:"namespaces"`
	Memo           bool    `json:"memo"`
	CPUSeconds     float64 `json:"cpuSeconds"`
	WallSeconds    float64 `json:"wallSeconds"`
	Decisions      int     `json:"decisions"`
	TasksSubmitted int64   `json:"tasksSubmitted"`
	// EvaluationErrors are decisions that failed (the volume is left alone), by kind: on a
	// starved CPU an evaluation can exceed the policy's evaluation timeout.
	EvaluationErrors map[string]float64 `json:"evaluationErrors,omitempty"`
	MemoHits         float64            `json:"memoHits"`
	MemoMisses       float64            `json:"memoMisses"`
	AllocatedBytes   uint64             `json:"allocatedBytes"`
	Allocations      uint64             `json:"allocations"`
	// Collections are the garbage collections the sweep caused, each a walk over the live heap
	// (LiveHeapBytes, the caches' records and indexes, measured before the sweep).
	Collections   uint32 `json:"collections"`
	LiveHeapBytes uint64 `json:"liveHeapBytes"`
	// ProfileTop are the first lines of `go tool pprof -top` of a second, profiled sweep.
	ProfileTop []string `json:"profileTop,omitempty"`
}

// teamPolicy is a site's own policy that reads each claim's namespace and labels, so that its
// decisions are memoized per namespace, application and tier rather than once for the whole
// cluster: claims labelled to be skipped and sandbox namespaces are left alone, databases and
// queues are probed before the rest, and the built-in policy decides everything else.
var teamPolicy = policy.Module{File: "teams.rego", Text: `package volumehealer

import data.volumehealer.builtin

decision := {"action": "skip", "reason": "OptedOut"} if {
	input.volume.pvc.labels["volume-healer.io/skip"] == "true"
} else := {"action": "skip", "reason": "Sandbox"} if {
	endswith(input.volume.pvc.namespace, "-sandbox")
} else := object.union(builtin.decision, {"priority": tier_priority[input.volume.pvc.labels.tier]}) if {
	builtin.decision.action != "skip"
} else := builtin.decision

tier_priority := {"db": 90, "queue": 50}

restart := builtin.restart
`}

// planningFixture is a controller's view of a cluster, in informer stores, without an apiserver.
type planningFixture struct {
	caches     planner.Caches
	targets    *healer.TargetMap
	classes    []string
	volumes    int
	nodes      int
	namespaces int
}

// teamNamespace and teamLabels spread the claims of a planning fixture over namespaces and
// give them labels as a cluster of many teams has them: each namespace runs one to eight
// applications, each application's claims carry its name, instance and tier (db, queue, cache
// or web; a fixed one per application) and the Helm label on most; one namespace in 25 is a
// sandbox and one claim in 100 is labelled to be skipped.
func teamNamespace(i, namespaces int) string {
	h := fnv.New32a()
	_, _ = fmt.Fprintf(h, "claim-%d", i)
	n := int(h.Sum32() % uint32(namespaces))
	if n%25 == 24 {
		return fmt.Sprintf("team-%03d-sandbox", n)
	}
	return fmt.Sprintf("team-%03d", n)
}

func teamLabels(i int, namespace string) map[string]string {
	h := fnv.New32a()
	_, _ = fmt.Fprintf(h, "%s/%d", namespace, i)
	v := h.Sum32()
	apps := 1 + int(fnv32(namespace)%8)
	app := int(v % uint32(apps))
	labels := map[string]string{
		"app.kubernetes.io/name":     fmt.Sprintf("app-%d", app),
		"app.kubernetes.io/instance": fmt.Sprintf("%s-app-%d", namespace, app),
		"tier":                       []string{"db", "queue", "cache", "web"}[(app+int(fnv32(namespace)))%4],
	}
	if app%3 != 2 {
		labels["app.kubernetes.io/managed-by"] = "Helm"
	}
	if v%100 == 42 {
		labels["volume-healer.io/skip"] = "true"
	}
	return labels
}

func fnv32(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}

// newPlanningFixture fills informer stores, indexed as the controller indexes them, with volumes
// spread perNode to a node. With namespaces above 0 the claims are spread over that many
// namespaces with the labels of teamLabels; otherwise they have the shapes' namespaces and
// labels.
func newPlanningFixture(s *shapes, volumes, perNode, namespaces int) (*planningFixture, error) {
	f := &planningFixture{
		caches:     planner.NewLocalCaches(),
		targets:    healer.NewTargetMap(),
		volumes:    volumes,
		namespaces: namespaces,
	}
	// The stores hold what the controller's informers hold: the records of planner.CacheTransform.
	add := func(_ cache.Store, obj kruntime.Object) error { return f.caches.Add(obj) }
	if err := add(f.caches.CSIDrivers, s.driver.DeepCopy()); err != nil {
		return nil, err
	}
	for _, sc := range s.storageClasses {
		if err := add(f.caches.StorageClasses, sc.DeepCopy()); err != nil {
			return nil, err
		}
		f.classes = append(f.classes, sc.Name)
	}
	f.nodes = (volumes + perNode - 1) / perNode
	for n := range f.nodes {
		name := fmt.Sprintf("node-%05d", n)
		if err := add(f.caches.Nodes, nodeObject(name, n)); err != nil {
			return nil, err
		}
		f.targets.Set(&csiaddonsv1alpha1.CSIAddonsNode{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: pluginNamespace, Name: sidecar.DefaultCSIAddonsNodeName(name, driverName),
				Annotations: map[string]string{annotations.Endpoint: fmt.Sprintf("10.%d.%d.%d:9070", n>>16&255, n>>8&255, n&255)},
			},
			Spec:   csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{Name: driverName, NodeID: name, EndPoint: fmt.Sprintf("10.%d.%d.%d:9070", n>>16&255, n>>8&255, n&255)}},
			Status: csiaddonsv1alpha1.CSIAddonsNodeStatus{Capabilities: []string{"service.NODE_SERVICE", "reclaimspace.NODE"}},
		})
		count := min(perNode, volumes-n*perNode)
		for i, v := range s.newVolumes(name, count) {
			if namespaces > 0 {
				v.namespace = teamNamespace(n*perNode+i, namespaces)
			}
			pv, pvc, va := s.objects(v)
			if namespaces > 0 {
				pvc.Labels = teamLabels(n*perNode+i, v.namespace)
			}
			if err := add(f.caches.PVs, pv); err != nil {
				return nil, err
			}
			if err := add(f.caches.PVCs, pvc); err != nil {
				return nil, err
			}
			if err := add(f.caches.VolumeAttachments, va); err != nil {
				return nil, err
			}
		}
	}
	return f, nil
}

// measure runs one periodic sweep of every StorageClass on one core, the way the controller runs
// them (healer.Sweeper with the planner, the policy engine and its metrics), with a sidecar client
// whose capability cache is warm and a dispatcher that ends each task unrun. When profile is set,
// a second sweep runs under the CPU profiler and the profile is written there.
func (f *planningFixture) measure(ctx context.Context, memo bool, profile string, modules ...policy.Module) (sweepCPU, error) {
	out := sweepCPU{Policy: "built-in", Volumes: f.volumes, Nodes: f.nodes, StorageClasses: len(f.classes), Namespaces: appNamespaces, Memo: memo}
	if f.namespaces > 0 {
		out.Namespaces = f.namespaces
	}
	reg := prometheus.NewRegistry()
	engine, err := policy.NewEngine(ctx, policy.Options{Compile: policy.CompileOptions{DisableMemo: !memo}, Metrics: policy.NewMetrics(reg)})
	if err != nil {
		return out, err
	}
	if len(modules) > 0 {
		if _, err := engine.Load(ctx, modules); err != nil {
			return out, err
		}
		out.Policy = strings.TrimSuffix(modules[0].File, ".rego")
	}
	dispatcher := &finishingDispatcher{}
	sweeper, err := healer.New(healer.Options{
		Planner:    planner.New(f.caches),
		Policy:     engine,
		Sidecars:   &cachedCapabilities{cache: map[string]*probe.Capabilities{}},
		Dispatcher: dispatcher,
		Targets:    f.targets,
		Client:     noClient{},
		Metrics:    healer.NewMetrics(reg),
	})
	if err != nil {
		return out, err
	}
	// The controller logs at verbosity 0; so does this, into nothing.
	ctx = klog.NewContext(ctx, textLogger(io.Discard))
	sweep := func() int {
		n := 0
		for _, sc := range f.classes {
			s := sweeper.Run(ctx, scheduler.Sweep{Trigger: scheduler.TriggerSchedule, StorageClass: sc, Stagger: 5 * time.Minute, Fired: time.Now()})
			n += s.Volumes
		}
		return n
	}

	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cpu0, err := cpuTime()
	if err != nil {
		return out, err
	}
	start := time.Now()
	out.Decisions = sweep()
	out.WallSeconds = time.Since(start).Seconds()
	cpu1, err := cpuTime()
	if err != nil {
		return out, err
	}
	runtime.ReadMemStats(&after)
	out.CPUSeconds = (cpu1 - cpu0).Seconds()
	out.AllocatedBytes = after.TotalAlloc - before.TotalAlloc
	out.Allocations = after.Mallocs - before.Mallocs
	out.Collections = after.NumGC - before.NumGC
	out.LiveHeapBytes = before.HeapAlloc
	out.TasksSubmitted = dispatcher.tasks.Load()
	families, err := reg.Gather()
	if err != nil {
		return out, err
	}
	for _, mf := range families {
		switch mf.GetName() {
		case "volume_healer_policy_memo_lookups_total":
			for _, m := range mf.GetMetric() {
				switch label(m, "result") {
				case "hit":
					out.MemoHits = m.GetCounter().GetValue()
				case "miss":
					out.MemoMisses = m.GetCounter().GetValue()
				}
			}
		case "volume_healer_policy_evaluation_errors_total":
			for _, m := range mf.GetMetric() {
				if v := m.GetCounter().GetValue(); v > 0 {
					if out.EvaluationErrors == nil {
						out.EvaluationErrors = map[string]float64{}
					}
					out.EvaluationErrors[label(m, "reason")] += v
				}
			}
		}
	}

	if profile != "" {
		file, err := os.Create(profile)
		if err != nil {
			return out, err
		}
		if err := pprof.StartCPUProfile(file); err != nil {
			_ = file.Close()
			return out, err
		}
		sweep()
		pprof.StopCPUProfile()
		if err := file.Close(); err != nil {
			return out, err
		}
		out.ProfileTop, err = pprofTop(profile, 20)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// cpuTime is the user and system CPU time of this process so far.
func cpuTime() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// pprofTop returns the header and the first n entries of `go tool pprof -top` of a profile.
func pprofTop(profile string, n int, flags ...string) ([]string, error) {
	args := append([]string{"tool", "pprof", "-top", fmt.Sprintf("-nodecount=%d", n)}, flags...)
	out, err := exec.Command("go", append(args, profile)...).Output()
	if err != nil {
		return nil, fmt.Errorf("go tool pprof -top %s: %w", profile, err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if strings.HasPrefix(l, "File:") || strings.HasPrefix(l, "Build ID:") || strings.HasPrefix(l, "Type:") || strings.HasPrefix(l, "Time:") {
			continue
		}
		lines = append(lines, l)
	}
	return lines, nil
}
