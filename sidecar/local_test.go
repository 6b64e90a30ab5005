package sidecar

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/sidecar/nodeprobe"
)

// TestListLocallyPages lists kubelet's records of a driver page by page: every volume once, in
// order, with its PV and staging path, and a token the sidecar did not give is refused.
func TestListLocallyPages(t *testing.T) {
	const driver = "fuse.csi.example.com"
	kubelet := t.TempDir()
	write := func(dir string, data map[string]string, mount string) {
		b, err := json.Marshal(data)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dir, mount), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "vol_data.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	records := nodeprobe.Records{KubeletDir: kubelet}
	for _, h := range []string{"vol-c", "vol-a", "vol-b"} {
		write(records.StagingDir(driver, h), map[string]string{"driverName": driver, "volumeHandle": h}, "globalmount")
		write(filepath.Join(kubelet, "pods", "pod-"+h, "volumes", "kubernetes.io~csi", "pv-"+h),
			map[string]string{"driverName": driver, "volumeHandle": h, "specVolID": "pv-" + h}, "mount")
	}
	h := &nodeHealer{nodeName: "node-1", volumes: newVolumes(nil, &Options{NodeName: "node-1", KubeletDir: kubelet}),
		local: nodeprobe.New(nodeprobe.Options{KubeletDir: kubelet})}
	info := &driverInfo{name: driver, healerUnimplemented: true}

	var got []string
	token := ""
	for page := 0; page < 5; page++ {
		resp, err := h.listLocally(context.Background(), info, &healerv1alpha1.NodeListStagedVolumesRequest{MaxEntries: 2, StartingToken: token})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetEntries()) > 2 {
			t.Fatalf("page of %d entries, asked for 2", len(resp.GetEntries()))
		}
		for _, e := range resp.GetEntries() {
			if e.GetPvName() != "pv-"+e.GetVolumeId() || e.GetStagingTargetPath() != healerv1alpha1.StagingTargetPath(filepath.Join(kubelet, "plugins", "kubernetes.io", "csi"), driver, e.GetVolumeId()) {
				t.Errorf("entry %v: wrong PV or staging path", e)
			}
			got = append(got, e.GetVolumeId())
		}
		if token = resp.GetNextToken(); token == "" {
			break
		}
	}
	if want := []string{"vol-a", "vol-b", "vol-c"}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("listed %q, want %q", got, want)
	}
	_, err := h.listLocally(context.Background(), info, &healerv1alpha1.NodeListStagedVolumesRequest{StartingToken: "vol-a"})
	if status.Code(err) != codes.Aborted {
		t.Fatalf("a token the sidecar did not give: %v, want ABORTED", err)
	}
}
