package nodeprobe_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/driverkit"
	"github.com/volume-healer/volume-healer/sidecar/nodeprobe"
)

// mountTable writes a mountinfo file with one line per mount and returns its path.
type mountLine struct {
	path, dev, opts string
}

func writeMountTable(t *testing.T, mounts ...mountLine) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("1 0 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n")
	for i, m := range mounts {
		fmt.Fprintf(&b, "%d 1 %s / %s %s shared:%d - fuse.test vol rw\n", 100+i, m.dev, m.path, m.opts, 100+i)
	}
	file := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// reasons summarises findings as "reason@path" with paths relative to the kubelet folder.
func reasons(dir string, findings []driverkit.Finding) []string {
	var out []string
	for _, f := range findings {
		rel, _ := filepath.Rel(dir, f.Path)
		out = append(out, f.Reason+"@"+rel)
	}
	slices.Sort(out)
	return out
}

// TestProbeClassifiesTheMountTable reads mount tables written by the test over plain folders
// (which the stat child answers for), so that it needs no privilege.
func TestProbeClassifiesTheMountTable(t *testing.T) {
	const stagingRel = "plugins/kubernetes.io/csi/" + testDriver
	tests := map[string]struct {
		readOnly bool
		// mounts lists the paths mounted, "staging", "a" or "b" (the targets of pod-a and
		// pod-b), each with its device and options.
		mounts map[string][2]string
		want   []string
	}{
		"everything mounted": {
			mounts: map[string][2]string{"staging": {"0:50", "rw"}, "a": {"0:50", "rw"}, "b": {"0:50", "rw"}},
		},
		"a target unmounted behind kubelet's back": {
			mounts: map[string][2]string{"staging": {"0:50", "rw"}, "a": {"0:50", "rw"}},
			want:   []string{"PublishTargetNotMounted@pods/pod-b/volumes/kubernetes.io~csi/pv-1/mount"},
		},
		"the staging path unmounted": {
			mounts: map[string][2]string{"a": {"0:50", "rw"}, "b": {"0:50", "rw"}},
			want:   []string{"MountGone@staging"},
		},
		"read-only mounts of a read-write volume": {
			mounts: map[string][2]string{"staging": {"0:50", "ro"}, "a": {"0:50", "ro,nosuid"}, "b": {"0:50", "rw"}},
			want:   []string{"ReadOnlyMount@pods/pod-a/volumes/kubernetes.io~csi/pv-1/mount", "ReadOnlyMount@staging"},
		},
		"read-only mounts of a read-only volume": {
			readOnly: true,
			mounts:   map[string][2]string{"staging": {"0:50", "ro"}, "a": {"0:50", "ro"}, "b": {"0:50", "ro"}},
		},
		"nothing mounted at all": {
			want: []string{"MountGone@staging", "PublishTargetNotMounted@pods/pod-a/volumes/kubernetes.io~csi/pv-1/mount", "PublishTargetNotMounted@pods/pod-b/volumes/kubernetes.io~csi/pv-1/mount"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			k := newKubeletDir(t)
			paths := map[string]string{
				"staging": k.stage(testDriver, "vol-1", "pv-1"),
				"a":       k.publish("pod-a", testDriver, "vol-1", "pv-1"),
				"b":       k.publish("pod-b", testDriver, "vol-1", "pv-1"),
			}
			var lines []mountLine
			for _, key := range []string{"staging", "a", "b"} {
				if m, ok := tc.mounts[key]; ok {
					lines = append(lines, mountLine{path: paths[key], dev: m[0], opts: m[1]})
				}
			}
			p := nodeprobe.New(nodeprobe.Options{KubeletDir: k.dir, MountInfo: writeMountTable(t, lines...)})
			_, findings, err := p.Probe(context.Background(), nodeprobe.Request{Driver: testDriver, Handle: "vol-1", PV: "pv-1", ReadOnly: tc.readOnly})
			if err != nil {
				t.Fatalf("Probe: %v", err)
			}
			got := reasons(k.dir, findings)
			for i := range got {
				got[i] = strings.Replace(got[i], "@"+stagingRel+"/"+filepath.Base(filepath.Dir(paths["staging"]))+"/globalmount", "@staging", 1)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("findings %q (%+v), want %q", got, findings, tc.want)
			}
		})
	}
}

func TestProbeRefusesVolumesNotOnTheNode(t *testing.T) {
	k := newKubeletDir(t)
	k.stage(testDriver, "vol-2", "pv-2")
	p := nodeprobe.New(nodeprobe.Options{KubeletDir: k.dir})
	if _, _, err := p.Probe(context.Background(), nodeprobe.Request{Driver: testDriver, Handle: "vol-1", PV: "pv-1"}); err == nil || !strings.Contains(err.Error(), "records neither") {
		t.Fatalf("Probe of a volume kubelet does not record: %v, want ErrNotOnNode", err)
	}
}

func TestStatterAnswersForPlainPaths(t *testing.T) {
	s := nodeprobe.NewStatter(nodeprobe.StatterOptions{Timeout: 10 * time.Second})
	if f, err := s.Stat(context.Background(), t.TempDir()); f != nil || err != nil {
		t.Fatalf("stat of a folder: %+v, %v; want no finding", f, err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	f, err := s.Stat(context.Background(), missing)
	if err != nil || f == nil || f.Reason != driverkit.ReasonMountGone {
		t.Fatalf("stat of a missing path: %+v, %v; want %s", f, err, driverkit.ReasonMountGone)
	}
	bad := nodeprobe.NewStatter(nodeprobe.StatterOptions{Command: []string{filepath.Join(t.TempDir(), "no-such-program")}})
	if _, err := bad.Stat(context.Background(), t.TempDir()); err == nil || !strings.Contains(err.Error(), "no-such-program") {
		t.Fatalf("stat with a missing program: %v, want an error naming it", err)
	}
}
