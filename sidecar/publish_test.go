package sidecar_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
)

// TestDriverGetsPublishTargets: the driver's ProbeVolume and HealVolume get the volume's publish
// target paths on the node, one per pod, from kubelet's records there, for filesystem and raw
// block volumes; a volume no pod uses gets none, and another driver's record of the same PV name
// is not this volume's.
func TestDriverGetsPublishTargets(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	block := corev1.PersistentVolumeBlock
	fsPV := f.pv("pv-1", "vol-1")
	blockPV := f.pv("pv-2", "vol-2", func(pv *corev1.PersistentVolume) { pv.Spec.VolumeMode = &block })
	idlePV := f.pv("pv-3", "vol-3")
	for _, pv := range []*corev1.PersistentVolume{fsPV, blockPV, idlePV} {
		f.create(pv)
	}

	// kubelet's records on the node: pv-1 published for two pods (and, under the same name,
	// a record of another driver's volume for a third), pv-2 a block volume of one pod.
	var fsTargets []string
	for _, pod := range []string{"uid-b", "uid-a"} {
		dir := filepath.Join(f.kubeletDir, "pods", pod, "volumes", "kubernetes.io~csi", fsPV.Name)
		writeVolData(t, dir, map[string]string{"driverName": f.driverName, "volumeHandle": "vol-1", "specVolID": fsPV.Name, "volumeLifecycleMode": "Persistent"})
		fsTargets = append(fsTargets, filepath.Join(dir, "mount"))
	}
	slices.Sort(fsTargets)
	writeVolData(t, filepath.Join(f.kubeletDir, "pods", "uid-c", "volumes", "kubernetes.io~csi", fsPV.Name),
		map[string]string{"driverName": "other.example.com", "volumeHandle": "vol-1", "specVolID": fsPV.Name})
	devices := filepath.Join(f.kubeletDir, "plugins", "kubernetes.io", "csi", "volumeDevices")
	writeVolData(t, filepath.Join(devices, blockPV.Name, "data"), map[string]string{"driverName": f.driverName, "volumeHandle": "vol-2", "specVolID": blockPV.Name})
	blockTarget := filepath.Join(devices, "publish", blockPV.Name, "uid-d")
	if err := os.MkdirAll(filepath.Dir(blockTarget), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(blockTarget, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	sc := f.startSidecar(nil)
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))
	tests := map[string]struct {
		pv   string
		want []string
	}{
		"filesystem volume of two pods": {pv: fsPV.Name, want: fsTargets},
		"raw block volume of one pod":   {pv: blockPV.Name, want: []string{blockTarget}},
		"volume no pod uses":            {pv: idlePV.Name},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			// The driver's answer does not matter here (the simulated driver keeps no block
			// volume): what it was asked does.
			_, _ = sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: tc.pv})
			if got := f.recorder.Probe(); got == nil || !slices.Equal(got.GetPublishTargetPaths(), tc.want) {
				t.Errorf("ProbeVolume of %s reached the driver with publish targets %q, want %q", tc.pv, got.GetPublishTargetPaths(), tc.want)
			}
			_, _ = sc.client.HealVolume(ctx, &healerv1alpha1.NodeHealVolumeRequest{PvName: tc.pv})
			if got := f.recorder.Heal(); got == nil || !slices.Equal(got.GetPublishTargetPaths(), tc.want) {
				t.Errorf("HealVolume of %s reached the driver with publish targets %q, want %q", tc.pv, got.GetPublishTargetPaths(), tc.want)
			}
		})
	}
}
