package scale

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/procfs"
	"k8s.io/client-go/rest"

	"github.com/volume-healer/volume-healer/test/harness"
)

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// apiserverCounts reads apiserver_request_total from the apiserver's /metrics, summed over
// codes, groups and versions per verb and resource, and the bytes of the responses from
// apiserver_response_sizes.
func apiserverCounts(ctx context.Context, rc rest.Interface) (requestSnapshot, error) {
	body, err := rc.Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return requestSnapshot{}, fmt.Errorf("apiserver /metrics: %w", err)
	}
	families, err := harness.ParseMetrics(bytes.NewReader(body))
	if err != nil {
		return requestSnapshot{}, fmt.Errorf("parse apiserver /metrics: %w", err)
	}
	out := requestSnapshot{Counts: map[requestKey]int64{}, Bytes: map[requestKey]int64{}}
	key := func(m *dto.Metric) (requestKey, bool) {
		res := label(m, "resource")
		if res == "" {
			return requestKey{}, false
		}
		if sub := label(m, "subresource"); sub != "" {
			res += "/" + sub
		}
		return requestKey{Verb: label(m, "verb"), Resource: res}, true
	}
	if f := families["apiserver_request_total"]; f != nil {
		for _, m := range f.GetMetric() {
			if k, ok := key(m); ok {
				out.Counts[k] += int64(m.GetCounter().GetValue())
			}
		}
	}
	if f := families["apiserver_response_sizes"]; f != nil {
		for _, m := range f.GetMetric() {
			if k, ok := key(m); ok {
				out.Bytes[k] += int64(m.GetHistogram().GetSampleSum())
			}
		}
	}
	return out, nil
}

// residentSet is a process's resident memory from /proc/<pid>/status, in bytes: Total is VmRSS,
// Anon the anonymous part (heap, stacks: what the process allocated), File the mapped files
// (the binary's pages the kernel can drop and read again).
type residentSet struct{ Total, Anon, File int64 }

// processMemory reads the resident set of a process.
func processMemory(pid int) (residentSet, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return residentSet{}, err
	}
	st, err := p.NewStatus()
	if err != nil {
		return residentSet{}, err
	}
	return residentSet{Total: int64(st.VmRSS), Anon: int64(st.RssAnon), File: int64(st.RssFile)}, nil
}

// processCPU reads the user and system CPU time of a process from /proc/<pid>/stat.
func processCPU(pid int) (time.Duration, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, err
	}
	st, err := p.Stat()
	if err != nil {
		return 0, err
	}
	// USER_HZ is 100 on every Linux architecture Go supports.
	return time.Duration(st.UTime+st.STime) * 10 * time.Millisecond, nil
}

// machineInfo describes the machine for the report.
type machineInfo struct {
	CPUs        int    `json:"cpus"`
	CPUModel    string `json:"cpuModel"`
	MemoryBytes int64  `json:"memoryBytes"`
	Kernel      string `json:"kernel"`
	GoVersion   string `json:"goVersion"`
}

func readMachine(goVersion string, cpus int) machineInfo {
	m := machineInfo{CPUs: cpus, GoVersion: goVersion}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if name, ok := strings.CutPrefix(line, "model name"); ok {
				m.CPUModel = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				f := strings.Fields(rest)
				if len(f) == 2 {
					kb, _ := strconv.ParseInt(f[0], 10, 64)
					m.MemoryBytes = kb * 1024
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}
