package config

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func TestSetMemoryLimit(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	noEnv := func(string) (string, bool) { return "", false }
	tests := map[string]struct {
		files   map[string]string
		env     func(string) (string, bool)
		want    int64
		source  string
		wantErr string
	}{
		"cgroup v2 limit":    {files: map[string]string{"memory.max": "536870912\n"}, want: 483183820, source: "memory.max"},
		"cgroup v2 no limit": {files: map[string]string{"memory.max": "max\n"}, source: "no limit"},
		"cgroup v1 limit":    {files: map[string]string{"memory/memory.limit_in_bytes": "268435456"}, want: 241591910, source: "memory.limit_in_bytes"},
		"cgroup v1 no limit": {files: map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712"}, source: "no limit"},
		"no cgroup files":    {source: "no cgroup memory limit found"},
		"GOMEMLIMIT wins": {files: map[string]string{"memory.max": "536870912"},
			env: func(k string) (string, bool) { return "100MiB", k == "GOMEMLIMIT" }, want: math.MaxInt64, source: "GOMEMLIMIT"},
		"garbage": {files: map[string]string{"memory.max": "lots"}, wantErr: `holds "lots", not a byte count`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			debug.SetMemoryLimit(math.MaxInt64)
			root := t.TempDir()
			for f, content := range tc.files {
				path := filepath.Join(root, f)
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			env := tc.env
			if env == nil {
				env = noEnv
			}
			got, err := SetMemoryLimit(root, env)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				if debug.SetMemoryLimit(-1) != math.MaxInt64 {
					t.Error("a bad limit file changed the runtime's limit")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(got.Source, tc.source) {
				t.Errorf("source %q, want it to mention %q", got.Source, tc.source)
			}
			want := tc.want
			if want == 0 {
				want = math.MaxInt64 // nothing set
			} else if got.Bytes != want {
				t.Errorf("reported %d bytes, want %d", got.Bytes, want)
			}
			if now := debug.SetMemoryLimit(-1); now != want {
				t.Errorf("runtime limit %d, want %d", now, want)
			}
		})
	}
}
