package scale

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// resultsSchema names the layout of results.json; docs/scale.md documents it. A change that
// renames or removes a field bumps the version.
const resultsSchema = "volume-healer.scale/v1"

// Results is everything one run measured. docs/scale.md documents each field.
type Results struct {
	Schema      string      `json:"schema"`
	Mode        string      `json:"mode"`
	Started     time.Time   `json:"started"`
	WallSeconds float64     `json:"wallSeconds"`
	Machine     machineInfo `json:"machine"`
	// LoadAverage is /proc/loadavg when the run started: other work on the machine skews times.
	LoadAverage string        `json:"loadAverage"`
	Layout      Layout        `json:"layout"`
	Setup       []setupStep   `json:"setup"`
	APIRequests []apiRequests `json:"apiRequests"`
	Latency     *latency      `json:"restartLatency"`
	// ControllerStart is what the first controller's sweep did with the restart its node plugin
	// announced before the controller started.
	ControllerStart *controllerStart `json:"controllerStart"`
	Storm           *storm           `json:"storm"`
	Memory          *memory          `json:"memory"`
	SweepCPU        []sweepCPU       `json:"sweepCPU"`
	Decisions       *decisions       `json:"policyDecisions"`
	Notes           []string         `json:"notes,omitempty"`
}

// setupStep is one batch of objects created through the apiserver.
type setupStep struct {
	Phase          string  `json:"phase"`
	Nodes          int     `json:"nodes"`
	Volumes        int     `json:"volumes"`
	Seconds        float64 `json:"seconds"`
	VolumesPerSec  float64 `json:"volumesPerSecond"`
	PluginsSeconds float64 `json:"pluginsSeconds"`
	// Method is how the objects were put there: "api" (created through the apiserver, six
	// writes a volume) or "etcd" (written into the apiserver's etcd, see etcdfill.go).
	Method string `json:"method"`
	// ServedSeconds is how long after the etcd writes the apiserver listed every object.
	ServedSeconds float64 `json:"servedSeconds,omitempty"`
}

// requestFigure is a set of API requests, watches left out of the sums (a watch is one long
// request that a sweep does not open).
type requestFigure struct {
	// Requests counts every request but WATCH.
	Requests float64 `json:"requests"`
	// ListGet counts LIST and GET requests.
	ListGet float64 `json:"listGet"`
	// Writes counts POST, PUT, PATCH and DELETE requests.
	Writes float64 `json:"writes"`
	// ResponseBytes is the size of the responses, watches left out.
	ResponseBytes float64 `json:"responseBytes"`
	// ByVerbResource counts requests by "VERB resource[/subresource]", watches included.
	ByVerbResource map[string]float64 `json:"byVerbResource"`
}

// figureOf averages a request snapshot over n occurrences.
func figureOf(s requestSnapshot, n int) requestFigure {
	if n <= 0 {
		n = 1
	}
	d := float64(n)
	f := requestFigure{
		Requests:       float64(s.total()) / d,
		ListGet:        float64(s.total("LIST", "GET")) / d,
		Writes:         float64(s.total("POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION")) / d,
		ResponseBytes:  float64(s.totalBytes()) / d,
		ByVerbResource: map[string]float64{},
	}
	for k, v := range s.byKey() {
		f.ByVerbResource[k] = float64(v) / d
	}
	return f
}

// apiRequests is figure 1 at one cluster size: the requests of restart sweeps, ours against the
// list-everything approach.
type apiRequests struct {
	ClusterVolumes int `json:"clusterVolumes"`
	NodeVolumes    int `json:"nodeVolumes"`
	// Sweeps is how many restart sweeps the per-sweep figures average.
	Sweeps int `json:"sweeps"`
	// BrokenPerRestart is how many of the node's volumes lost their mount before each restart,
	// for its sweep to heal.
	BrokenPerRestart int `json:"brokenPerRestart"`
	// Controller are the controller's requests per sweep, counted at its API endpoint.
	Controller requestFigure `json:"controller"`
	// ControllerListGetMax is the most LIST and GET requests the controller made in one sweep.
	ControllerListGetMax int64 `json:"controllerListGetMax"`
	// ControllerRequestsMin and Max bound the controller's requests per sweep.
	ControllerRequestsMin int64 `json:"controllerRequestsMin"`
	ControllerRequestsMax int64 `json:"controllerRequestsMax"`
	// Sidecar are the restarted sidecar's own requests per restart (its start: caches, marker).
	Sidecar requestFigure `json:"sidecar"`
	// APIServer is apiserver_request_total over each sweep's window, every client together.
	APIServer requestFigure `json:"apiserver"`
	// SweepSeconds is the mean time from the restart marker's acceptance to the handled marker.
	SweepSeconds float64 `json:"sweepSeconds"`
	// Heals is the mean number of heals per sweep (driver calls).
	Heals float64 `json:"heals"`
	// APIServerWithWatches is apiserver_request_total per sweep, every client and every verb
	// together, watches included (APIServer.Requests leaves them out).
	APIServerWithWatches float64 `json:"apiserverWithWatches"`
	Peer                 peer    `json:"peer"`
}

// restartBudget is what a node plugin restart may cost the API server, every client counted:
// a handful of requests (the restarted sidecar's registration and watches, the controller's
// handled marker), and per volume that needs a heal its Event, its status and the Secret the
// heal reads.
func restartBudget(heals float64) float64 { return 10 + 3*heals }

// peer is the list-everything approach for the same node.
type peer struct {
	Volumes int `json:"volumes"`
	// Client are its requests as its client counted them.
	Client requestFigure `json:"client"`
	// APIServer is apiserver_request_total over its window.
	APIServer requestFigure `json:"apiserver"`
	Seconds   float64       `json:"seconds"`
	// SecondsAtDefaultRateLimit is computed: the time its requests take under client-go's
	// default client-side limit of 5 requests per second (burst 10).
	SecondsAtDefaultRateLimit float64 `json:"secondsAtDefaultRateLimit"`
}

// controllerStart is the restart sweep of a node whose plugin started before the controller: it
// should probe every volume on the node.
type controllerStart struct {
	NodeVolumes int `json:"nodeVolumes"`
	// Probed is how many of the node's volumes the sweep probed before it recorded the restart
	// as handled.
	Probed int `json:"probed"`
}

// latency is figure 2: from the apiserver accepting the sidecar's restart marker to the first
// ProbeVolume at that node's driver.
type latency struct {
	NodeVolumes     int       `json:"nodeVolumes"`
	ClusterVolumes  int       `json:"clusterVolumes"`
	Restarts        int       `json:"restarts"`
	DebounceSeconds float64   `json:"debounceSeconds"`
	P50Ms           float64   `json:"p50Ms"`
	P99Ms           float64   `json:"p99Ms"`
	MinMs           float64   `json:"minMs"`
	MaxMs           float64   `json:"maxMs"`
	SamplesMs       []float64 `json:"samplesMs"`
	// AllProbedP50Ms and AllProbedP99Ms are from the same marker to the end of the node's last
	// probe: every volume on the node looked at.
	AllProbedP50Ms float64 `json:"allProbedP50Ms"`
	AllProbedP99Ms float64 `json:"allProbedP99Ms"`
}

// storm is figure 3: every node plugin restarts within seconds.
type storm struct {
	Nodes                int     `json:"nodes"`
	Volumes              int     `json:"volumes"`
	Global               int     `json:"budgetGlobal"`
	PerDriver            int     `json:"budgetPerDriver"`
	PerNode              int     `json:"budgetPerNode"`
	DebounceSeconds      float64 `json:"debounceSeconds"`
	CallDelayMs          float64 `json:"callDelayMs"`
	MeanDriverCallMs     float64 `json:"meanDriverCallMs"`
	MeanControllerCallMs float64 `json:"meanControllerCallMs"`
	// RolloutSeconds is from the first to the last restart marker accepted.
	RolloutSeconds float64 `json:"rolloutSeconds"`
	// FirstProbeSeconds is from the first restart marker to the first probe.
	FirstProbeSeconds float64 `json:"firstProbeSeconds"`
	// FinishSeconds is from the first restart marker to the end of the last probe.
	FinishSeconds float64 `json:"finishSeconds"`
	// DispatchSeconds is from the start of the first probe to the end of the last.
	DispatchSeconds float64 `json:"dispatchSeconds"`
	// HandledSeconds is from the first restart marker to the last handled marker written.
	HandledSeconds float64 `json:"handledSeconds"`
	// IdealSeconds is the budget-bound ideal: the time in driver calls divided by the global
	// budget.
	IdealSeconds float64 `json:"idealSeconds"`
	// Efficiency is IdealSeconds / FinishSeconds; DispatchEfficiency is IdealSeconds /
	// DispatchSeconds.
	Efficiency         float64 `json:"efficiency"`
	DispatchEfficiency float64 `json:"dispatchEfficiency"`
	// ArrivalIdealSeconds is the best finish from the first marker for any dispatcher with these
	// budgets, given when each node's sweep released its work (marker plus debounce) and the mean
	// driver call (simulated); ArrivalEfficiency is ArrivalIdealSeconds / FinishSeconds.
	ArrivalIdealSeconds float64 `json:"arrivalIdealSeconds"`
	ArrivalEfficiency   float64 `json:"arrivalEfficiency"`
	// ArrivalTakingTurnsSeconds is the same simulation with the nodes taking turns (one task
	// each per pass), the order of the controller's dispatcher before it ranked lanes by
	// their queued work: kept for comparison.
	ArrivalTakingTurnsSeconds float64 `json:"arrivalTakingTurnsSeconds"`
	// LastNode is the node whose sweep ended last, LastNodeVolumes its volumes, and TailSeconds
	// how long it ran after every other node's sweep had ended.
	LastNode        string  `json:"lastNode"`
	LastNodeVolumes int     `json:"lastNodeVolumes"`
	TailSeconds     float64 `json:"tailSeconds"`
	// NodeTimeline is each node's sweep, in seconds from the first restart marker.
	NodeTimeline []stormNode `json:"nodeTimeline"`
	// HandledLagP50Seconds and HandledLagMaxSeconds are from a node's last probe to the
	// apiserver accepting its handled marker.
	HandledLagP50Seconds float64 `json:"handledLagP50Seconds"`
	HandledLagMaxSeconds float64 `json:"handledLagMaxSeconds"`
	// MeanInFlight is the calls in flight at the drivers, sampled every 5ms over the dispatch
	// window; Utilization is MeanInFlight / global budget.
	MeanInFlight float64 `json:"meanInFlight"`
	Utilization  float64 `json:"utilization"`
	// BacklogSeconds is how long the controller's dispatcher had tasks queued (its
	// volume_healer_dispatch_queued gauge, read every 200ms); BacklogControllerUtilization is its
	// in-flight gauge over the global budget then, BacklogDriverUtilization the drivers' calls in
	// flight over the global budget then.
	BacklogSeconds               float64 `json:"backlogSeconds"`
	BacklogControllerUtilization float64 `json:"backlogControllerUtilization"`
	BacklogDriverUtilization     float64 `json:"backlogDriverUtilization"`
	// RestartP50Seconds and RestartMaxSeconds are how long one node plugin took to stop, start
	// and have its restart marker accepted, with 64 restarting at a time.
	RestartP50Seconds float64 `json:"restartP50Seconds"`
	RestartMaxSeconds float64 `json:"restartMaxSeconds"`
	// MaxInFlight, MaxInFlightPerNode and MaxInFlightPerVolume are the most calls seen at once
	// at the drivers: across all nodes, on one node, on one volume.
	MaxInFlight          int64 `json:"maxInFlight"`
	MaxInFlightPerNode   int   `json:"maxInFlightPerNode"`
	MaxInFlightPerVolume int   `json:"maxInFlightPerVolume"`
	// DriverMaxConcurrentPerNode and DriverMaxConcurrentPerVolume are the reference drivers' own
	// counters (Counters.MaxConcurrent and MaxConcurrentPerVolume), the highest over all nodes.
	DriverMaxConcurrentPerNode   int64 `json:"driverMaxConcurrentPerNode"`
	DriverMaxConcurrentPerVolume int64 `json:"driverMaxConcurrentPerVolume"`
	// BudgetViolations counts budgets exceeded: global, any node's, any volume's.
	BudgetViolations     int           `json:"budgetViolations"`
	VolumesProbed        int           `json:"volumesProbed"`
	Probes               int64         `json:"probes"`
	Heals                int64         `json:"heals"`
	ControllerCPUSeconds float64       `json:"controllerCpuSeconds"`
	HarnessCPUSeconds    float64       `json:"harnessCpuSeconds"`
	ControllerRequests   requestFigure `json:"controllerRequests"`
	ControllerRSSBytes   int64         `json:"controllerRssBytesAfter"`
	ControllerHeapBytes  int64         `json:"controllerHeapInuseBytesAfter"`
	// DispatcherBenchmark is scheduler's BenchmarkDispatchStorm (the dispatcher alone, same
	// budgets, 200 nodes x 100 volumes), run after the cluster stopped; full runs only.
	DispatcherBenchmark []benchmarkLine `json:"dispatcherBenchmark,omitempty"`
	// ControllerProfileTop and ControllerProfileTopCum are `go tool pprof -top` (flat and -cum)
	// of the controller from the start of the storm (Layout.ControllerProfile long), from a build
	// of the controller with net/http/pprof added through a build overlay.
	ControllerProfileTop    []string `json:"controllerProfileTop,omitempty"`
	ControllerProfileTopCum []string `json:"controllerProfileTopCum,omitempty"`
	// ProfileTop is `go tool pprof -top` of the harness process (sidecars and drivers) during
	// the storm.
	ProfileTop []string `json:"profileTop,omitempty"`
}

// stormNode is one node's sweep in the storm, in seconds from the first restart marker.
type stormNode struct {
	Name                string  `json:"name"`
	Volumes             int     `json:"volumes"`
	MarkerSeconds       float64 `json:"markerSeconds"`
	FirstProbeSeconds   float64 `json:"firstProbeSeconds"`
	LastProbeEndSeconds float64 `json:"lastProbeEndSeconds"`
}

// memoryPoint is the controller's memory with a number of volumes in its caches.
type memoryPoint struct {
	// Volumes is the number of PVs, of PVCs and of VolumeAttachments in the cluster.
	Volumes  int   `json:"volumes"`
	Nodes    int   `json:"nodes"`
	RSSBytes int64 `json:"rssBytes"`
	// RSSAnonBytes is the anonymous part of RSSBytes; the rest is the binary's mapped pages.
	RSSAnonBytes   int64 `json:"rssAnonBytes"`
	HeapInuseBytes int64 `json:"heapInuseBytes"`
	// GoMemoryLimitBytes is the controller's Go memory limit when its memory was read, which it
	// keeps a headroom above its live heap once its caches are full; 0 for none.
	GoMemoryLimitBytes int64 `json:"goMemoryLimitBytes,omitempty"`
	// Extrapolated is true for points computed from the fit rather than measured.
	Extrapolated bool `json:"extrapolated"`
	// ReadySeconds is how long the fresh controller took to fill its caches and answer /readyz.
	ReadySeconds float64 `json:"readySeconds,omitempty"`
	// HandledSeconds is how long it took until its handlers had seen every object and it set
	// its Go memory limit; its memory is read Settle after that.
	HandledSeconds float64 `json:"handledSeconds,omitempty"`
}

// memory is figure 4.
type memory struct {
	Points []memoryPoint `json:"points"`
	// RSSBytesPerVolume and HeapBytesPerVolume are the slopes of a least-squares line through
	// the measured points; the intercepts are the line at zero volumes.
	RSSBytesPerVolume  float64 `json:"rssBytesPerVolume"`
	HeapBytesPerVolume float64 `json:"heapBytesPerVolume"`
	RSSInterceptBytes  float64 `json:"rssInterceptBytes"`
	// RSSAnonBytesPerVolume and RSSAnonInterceptBytes fit the anonymous part of RSS.
	RSSAnonBytesPerVolume float64 `json:"rssAnonBytesPerVolume"`
	RSSAnonInterceptBytes float64 `json:"rssAnonInterceptBytes"`
	HeapInterceptBytes    float64 `json:"heapInterceptBytes"`
	// Caches are the controller's informer caches rebuilt in the harness's process and measured
	// after a garbage collection, with its transform and with a stricter one.
	Caches []cacheHeap `json:"caches"`
}

// decisions is figure 6.
type decisions struct {
	// InProcess are measured by this harness on inputs built from its own objects.
	InProcess []decisionRate `json:"inProcess"`
	// Benchmarks are the policy package's benchmarks (go test -bench), full runs only.
	Benchmarks []benchmarkLine `json:"benchmarks,omitempty"`
}

type decisionRate struct {
	Name               string  `json:"name"`
	DecisionsPerSecond float64 `json:"decisionsPerSecond"`
	NsPerDecision      float64 `json:"nsPerDecision"`
}

type benchmarkLine struct {
	Name    string             `json:"name"`
	Metrics map[string]float64 `json:"metrics"`
}

// percentile returns the nearest-rank percentile p (0-100) of v.
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}

// fitLine returns the least-squares slope and intercept of y over x.
func fitLine(x, y []float64) (slope, intercept float64) {
	n := float64(len(x))
	if n < 2 {
		return 0, 0
	}
	var sx, sy, sxx, sxy float64
	for i := range x {
		sx += x[i]
		sy += y[i]
		sxx += x[i] * x[i]
		sxy += x[i] * y[i]
	}
	den := n*sxx - sx*sx
	if den == 0 {
		return 0, 0
	}
	slope = (n*sxy - sx*sy) / den
	return slope, (sy - slope*sx) / n
}

// write stores r as indented JSON at path.
func (r *Results) write(path string) error { return writeJSON(path, r) }

// writeJSON stores v as indented JSON at path.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// loadAverage is /proc/loadavg now, or "" where it cannot be read.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
