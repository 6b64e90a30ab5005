package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// MemoryLimitShare is the part of the container's memory limit that the Go runtime is told it may
// use: the rest is left for memory the runtime does not count (thread stacks, cgroup page cache
// of the binary) so that the kernel's OOM killer is not reached first.
const MemoryLimitShare = 0.9

// cgroupLimitFiles are where the container's memory limit is read: cgroup v2, then v1.
var cgroupLimitFiles = []string{"memory.max", filepath.Join("memory", "memory.limit_in_bytes")}

// MemoryLimitFromEnv is the Source of a MemoryLimit that GOMEMLIMIT set.
const MemoryLimitFromEnv = "GOMEMLIMIT"

// MemoryLimit is what SetMemoryLimit did.
type MemoryLimit struct {
	// Bytes is the soft limit set for the Go runtime; 0 when none was set.
	Bytes int64
	// Source says where it came from: "GOMEMLIMIT", a cgroup file, or why nothing was set.
	Source string
}

// SetMemoryLimit gives the Go runtime a soft memory limit of MemoryLimitShare of the container's
// cgroup memory limit, read under cgroupRoot (normally /sys/fs/cgroup). Without a limit the heap
// grows to twice what the informer caches keep between collections; with one, the collector runs
// more often as the limit nears instead of the container being killed. A GOMEMLIMIT set in the
// environment wins and is left alone.
func SetMemoryLimit(cgroupRoot string, env func(string) (string, bool)) (MemoryLimit, error) {
	if v, ok := env("GOMEMLIMIT"); ok && v != "" {
		return MemoryLimit{Bytes: debug.SetMemoryLimit(-1), Source: MemoryLimitFromEnv}, nil
	}
	for _, name := range cgroupLimitFiles {
		path := filepath.Join(cgroupRoot, name)
		raw, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return MemoryLimit{}, fmt.Errorf("memory limit: %w", err)
		}
		text := strings.TrimSpace(string(raw))
		if text == "max" {
			return MemoryLimit{Source: path + " says max: no limit"}, nil
		}
		limit, err := strconv.ParseInt(text, 10, 64)
		if err != nil || limit <= 0 {
			return MemoryLimit{}, fmt.Errorf("memory limit: %s holds %q, not a byte count", path, text)
		}
		// cgroup v1 reports "no limit" as a huge page-aligned number.
		if limit >= 1<<62 {
			return MemoryLimit{Source: path + ": no limit"}, nil
		}
		soft := int64(float64(limit) * MemoryLimitShare)
		debug.SetMemoryLimit(soft)
		return MemoryLimit{Bytes: soft, Source: path}, nil
	}
	return MemoryLimit{Source: "no cgroup memory limit found"}, nil
}
