package scale

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/prometheus/procfs"

	"github.com/volume-healer/volume-healer/scheduler/planner"
)

// cacheProcess is the memory of a process that holds nothing but the controller's caches of a
// cluster's volumes, decoded from the API server's protobuf encoding through the controller's
// transform (figure 4's in-process measurement) in a process of its own, so that its RSS is not
// the harness's: what the caches add to a controller's RSS, with the Go runtime's overhead on
// them, at a size the API server on this machine cannot be filled to.
type cacheProcess struct {
	Volumes   int   `json:"volumes"`
	LiveBytes int64 `json:"liveBytes"`
	// RSSBytes is the process's VmRSS after a collection that returned free memory to the system;
	// PeakRSSBytes its VmHWM, the most it held while filling the caches.
	RSSBytes     int64 `json:"rssBytes"`
	PeakRSSBytes int64 `json:"peakRssBytes"`
	// BaselineRSSBytes is the same process's RSS with no volumes: the test binary and the Go
	// runtime, which a controller has too, though not the same.
	BaselineRSSBytes int64 `json:"baselineRssBytes"`
}

// cacheProcessEnv names the volumes a child process fills its caches with.
const cacheProcessEnv = "VOLUME_HEALER_SCALE_CACHE_PROCESS"

// measureCacheProcess runs this test binary again as a child that fills the caches with volumes
// and reports its memory, and once more with none for the baseline.
func measureCacheProcess(volumes int) (cacheProcess, error) {
	base, err := runCacheProcess(0)
	if err != nil {
		return base, err
	}
	r, err := runCacheProcess(volumes)
	r.BaselineRSSBytes = base.RSSBytes
	return r, err
}

func runCacheProcess(volumes int) (cacheProcess, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestCacheProcess$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", cacheProcessEnv, volumes))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return cacheProcess{}, fmt.Errorf("cache process: %w: %s%s", err, out, stderr.String())
	}
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "cache-process: "); ok {
			var r cacheProcess
			if err := json.Unmarshal([]byte(rest), &r); err != nil {
				return r, err
			}
			return r, nil
		}
	}
	return cacheProcess{}, fmt.Errorf("cache process printed no result: %s", out)
}

// fillCacheProcess is the child's work: fill the caches, collect, report.
func fillCacheProcess(volumes int) (cacheProcess, error) {
	s, err := newShapes()
	if err != nil {
		return cacheProcess{}, err
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	caches, err := s.decodedCaches(planner.CacheTransform, volumes)
	if err != nil {
		return cacheProcess{}, err
	}
	runtime.GC()
	debug.FreeOSMemory()
	runtime.ReadMemStats(&after)
	out := cacheProcess{Volumes: volumes, LiveBytes: int64(after.HeapAlloc) - int64(before.HeapAlloc)}
	st := selfStatus()
	out.RSSBytes, out.PeakRSSBytes = int64(st.VmRSS), int64(st.VmHWM)
	runtime.KeepAlive(caches)
	return out, nil
}

// selfStatus reads /proc/self/status; zero when it cannot.
func selfStatus() procfs.ProcStatus {
	p, err := procfs.Self()
	if err != nil {
		return procfs.ProcStatus{}
	}
	st, _ := p.NewStatus()
	return st
}
