package nodeprobe_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/volume-healer/volume-healer/sidecar/nodeprobe"
	"github.com/volume-healer/volume-healer/test/kubelet"
)

const testDriver = "fuse.csi.example.com"

// kubeletDir is a kubelet root folder written in kubelet's layout.
type kubeletDir struct {
	t   *testing.T
	dir string
}

func newKubeletDir(t *testing.T) *kubeletDir {
	return &kubeletDir{t: t, dir: t.TempDir()}
}

func (k *kubeletDir) write(file string, content []byte) {
	k.t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		k.t.Fatal(err)
	}
	if content != nil {
		if err := os.WriteFile(file, content, 0o644); err != nil {
			k.t.Fatal(err)
		}
	}
}

func volData(t *testing.T, fields map[string]string) []byte {
	b, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// stage writes the staging record of a volume as kubelet's MountDevice does, and returns the
// staging path.
func (k *kubeletDir) stage(driver, handle, pv string) string {
	k.t.Helper()
	dir := nodeprobe.Records{KubeletDir: k.dir}.StagingDir(driver, handle)
	k.write(filepath.Join(dir, "vol_data.json"), volData(k.t, map[string]string{"driverName": driver, "volumeHandle": handle, "specVolID": pv}))
	k.write(filepath.Join(dir, "globalmount", "x"), nil)
	return filepath.Join(dir, "globalmount")
}

// publish writes the publish record of a volume for a pod as kubelet's SetUp does, and returns
// the publish target.
func (k *kubeletDir) publish(pod, driver, handle, pv string) string {
	k.t.Helper()
	dir := filepath.Join(k.dir, "pods", pod, "volumes", "kubernetes.io~csi", pv)
	k.write(filepath.Join(dir, "vol_data.json"), volData(k.t, map[string]string{
		"specVolID": pv, "volumeHandle": handle, "driverName": driver, "nodeName": "node-1",
		"attachmentID": "csi-0123", "volumeLifecycleMode": "Persistent",
	}))
	k.write(filepath.Join(dir, "mount", "x"), nil)
	return filepath.Join(dir, "mount")
}

func TestRecordsFind(t *testing.T) {
	tests := map[string]struct {
		setup func(k *kubeletDir)
		// want: staged, the pods whose targets are listed; wantErr: the error and a text the
		// message must hold.
		staged  bool
		pods    []string
		wantErr error
		errText string
	}{
		"staged and published for two pods": {
			setup: func(k *kubeletDir) {
				k.stage(testDriver, "vol-1", "pv-1")
				k.publish("pod-b", testDriver, "vol-1", "pv-1")
				k.publish("pod-a", testDriver, "vol-1", "pv-1")
				k.publish("pod-c", testDriver, "vol-2", "pv-2")
			},
			staged: true, pods: []string{"pod-a", "pod-b"},
		},
		"published without staging (a driver without STAGE_UNSTAGE_VOLUME)": {
			setup:  func(k *kubeletDir) { k.publish("pod-a", testDriver, "vol-1", "pv-1") },
			staged: false, pods: []string{"pod-a"},
		},
		"staged, no pod": {
			setup:  func(k *kubeletDir) { k.stage(testDriver, "vol-1", "pv-1") },
			staged: true,
		},
		"a pod's record of the same PV name for another driver is not this volume": {
			setup: func(k *kubeletDir) {
				k.stage(testDriver, "vol-1", "pv-1")
				k.publish("pod-a", "other.csi.example.com", "vol-1", "pv-1")
			},
			staged: true,
		},
		"nothing recorded": {
			setup:   func(k *kubeletDir) { k.stage(testDriver, "vol-2", "pv-2") },
			wantErr: nodeprobe.ErrNotOnNode, errText: "records neither a staging path",
		},
		"corrupt publish record": {
			setup: func(k *kubeletDir) {
				k.stage(testDriver, "vol-1", "pv-1")
				k.write(filepath.Join(k.dir, "pods", "pod-a", "volumes", "kubernetes.io~csi", "pv-1", "vol_data.json"), []byte("{not json"))
			},
			wantErr: nodeprobe.ErrBadRecord, errText: filepath.Join("pods", "pod-a", "volumes", "kubernetes.io~csi", "pv-1", "vol_data.json"),
		},
		"publish record missing beside its mount folder": {
			setup: func(k *kubeletDir) {
				k.write(filepath.Join(k.dir, "pods", "pod-a", "volumes", "kubernetes.io~csi", "pv-1", "mount", "x"), nil)
			},
			wantErr: nodeprobe.ErrBadRecord, errText: filepath.Join("pod-a", "volumes", "kubernetes.io~csi", "pv-1", "vol_data.json") + " is missing",
		},
		"staging record missing beside globalmount": {
			setup: func(k *kubeletDir) {
				k.write(filepath.Join(nodeprobe.Records{KubeletDir: k.dir}.StagingDir(testDriver, "vol-1"), "globalmount", "x"), nil)
			},
			wantErr: nodeprobe.ErrBadRecord, errText: "vol_data.json is missing",
		},
		"staging record of another volume in this volume's folder": {
			setup: func(k *kubeletDir) {
				dir := nodeprobe.Records{KubeletDir: k.dir}.StagingDir(testDriver, "vol-1")
				k.write(filepath.Join(dir, "vol_data.json"), volData(t, map[string]string{"driverName": testDriver, "volumeHandle": "vol-9"}))
			},
			wantErr: nodeprobe.ErrBadRecord, errText: `names driver "` + testDriver + `" and volume handle "vol-9"`,
		},
		"a record without a volume handle": {
			setup: func(k *kubeletDir) {
				dir := nodeprobe.Records{KubeletDir: k.dir}.StagingDir(testDriver, "vol-1")
				k.write(filepath.Join(dir, "vol_data.json"), volData(t, map[string]string{"driverName": testDriver}))
			},
			wantErr: nodeprobe.ErrBadRecord, errText: "names no volumeHandle",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			k := newKubeletDir(t)
			tc.setup(k)
			r := nodeprobe.Records{KubeletDir: k.dir}
			v, err := r.Find(testDriver, "vol-1", "pv-1")
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("Find: got %v, want %v naming %q", err, tc.wantErr, tc.errText)
				}
				return
			}
			if err != nil {
				t.Fatalf("Find: %v", err)
			}
			wantStaging := ""
			if tc.staged {
				wantStaging = filepath.Join(r.StagingDir(testDriver, "vol-1"), "globalmount")
			}
			var wantTargets []string
			for _, pod := range tc.pods {
				wantTargets = append(wantTargets, filepath.Join(k.dir, "pods", pod, "volumes", "kubernetes.io~csi", "pv-1", "mount"))
			}
			if v.StagingPath != wantStaging || !slices.Equal(v.Targets, wantTargets) {
				t.Fatalf("Find: staging %q, targets %q; want %q, %q", v.StagingPath, v.Targets, wantStaging, wantTargets)
			}
		})
	}
}

func TestRecordsList(t *testing.T) {
	k := newKubeletDir(t)
	k.stage(testDriver, "vol-b", "pv-b")
	k.publish("pod-1", testDriver, "vol-b", "pv-b")
	k.publish("pod-2", testDriver, "vol-a", "pv-a") // published, not staged
	k.stage("other.csi.example.com", "vol-c", "pv-c")
	k.publish("pod-3", "other.csi.example.com", "vol-c", "pv-c")
	// An inline ephemeral volume has no PV.
	eph := filepath.Join(k.dir, "pods", "pod-4", "volumes", "kubernetes.io~csi", "scratch")
	k.write(filepath.Join(eph, "vol_data.json"), volData(t, map[string]string{"driverName": testDriver, "volumeHandle": "csi-eph", "volumeLifecycleMode": "Ephemeral"}))
	// A corrupt staging record of a third volume.
	bad := nodeprobe.Records{KubeletDir: k.dir}.StagingDir(testDriver, "vol-z")
	k.write(filepath.Join(bad, "vol_data.json"), []byte("[]"))

	got, err := nodeprobe.Records{KubeletDir: k.dir}.List(testDriver)
	if !errors.Is(err, nodeprobe.ErrBadRecord) || !strings.Contains(err.Error(), filepath.Join(bad, "vol_data.json")) {
		t.Errorf("List: error %v, want %v naming %s", err, nodeprobe.ErrBadRecord, filepath.Join(bad, "vol_data.json"))
	}
	var summary []string
	for _, v := range got {
		s := v.Handle + " pv=" + v.PV + " staged=" + map[bool]string{true: "yes", false: "no"}[v.StagingPath != ""]
		for _, target := range v.Targets {
			rel, _ := filepath.Rel(k.dir, target)
			s += " " + rel
		}
		summary = append(summary, s)
	}
	want := []string{
		"vol-a pv=pv-a staged=no pods/pod-2/volumes/kubernetes.io~csi/pv-a/mount",
		"vol-b pv=pv-b staged=yes pods/pod-1/volumes/kubernetes.io~csi/pv-b/mount",
	}
	if !slices.Equal(summary, want) {
		t.Fatalf("List:\n got %q\nwant %q", summary, want)
	}

	if got, err := (nodeprobe.Records{KubeletDir: t.TempDir()}).List(testDriver); err != nil || len(got) != 0 {
		t.Fatalf("List of an empty kubelet folder: %v, %v; want nothing", got, err)
	}
}

func TestPublishTargetIsKubeletsPath(t *testing.T) {
	k, err := kubelet.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Close() })
	r := nodeprobe.Records{KubeletDir: k.Root()}
	const pod, pv = "1f0c7a52-0b9e-4c55-9d6a-2f1b0e8c3d44", "pvc-7d1e"
	if got, want := r.PublishTarget(pod, pv), k.PublishPath(pod, pv); got != want {
		t.Errorf("PublishTarget = %s, kubelet publishes at %s", got, want)
	}
	// kubelet's getSubpathBindTarget (mount-utils subpath_linux.go): <pod dir>/volume-subpaths/...
	if got, want := r.SubpathDir(pod), filepath.Join(k.Root(), "pods", pod, "volume-subpaths"); got != want {
		t.Errorf("SubpathDir = %s, want %s", got, want)
	}
}
