package plugin

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/driverkit"
	"github.com/volume-healer/volume-healer/refdriver/control"
)

func TestVolumeIDFor(t *testing.T) {
	a, b := volumeIDFor("pvc-1"), volumeIDFor("pvc-2")
	if a != volumeIDFor("pvc-1") {
		t.Errorf("the ID of a name changes between calls: a retried CreateVolume would make a second volume")
	}
	if a == b {
		t.Errorf("two names share the ID %s", a)
	}
	for _, id := range []string{a, b, volumeIDFor(""), volumeIDFor("../../etc")} {
		if !volumeIDPattern.MatchString(id) {
			t.Errorf("volumeIDFor gave %q, which the plugin does not accept as its own ID", id)
		}
	}
	for _, id := range []string{"../vol-0123", "vol-0123456789abcdef01234567/..", "fake-vol-id", ""} {
		if volumeIDPattern.MatchString(id) {
			t.Errorf("%q passes for an ID the plugin created", id)
		}
	}
}

func TestValidateCapability(t *testing.T) {
	mount := func(m csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
		return &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: m},
		}
	}
	tests := map[string]struct {
		c  *csi.VolumeCapability
		ok bool
	}{
		"single-node writer":      {c: mount(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), ok: true},
		"multi-node multi-writer": {c: mount(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER), ok: true},
		"a reader only":           {c: mount(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY)},
		"no access mode":          {c: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}}},
		"block": {c: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
		"no access type": {c: &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}},
		"nil":            {},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			why := validateCapability(tt.c)
			if (why == "") != tt.ok {
				t.Errorf("validateCapability(%v) = %q, want ok=%t", tt.c, why, tt.ok)
			}
		})
	}
}

func TestConditionOf(t *testing.T) {
	finding := func(s csi.VolumeHealthErrorType, reason string) driverkit.Finding {
		return driverkit.Finding{Status: s, Reason: reason}
	}
	tests := map[string]struct {
		findings []driverkit.Finding
		want     control.Condition
	}{
		"nothing wrong":       {want: control.Healthy},
		"a dead mount":        {findings: []driverkit.Finding{finding(csi.VolumeHealthErrorType_INACCESSIBLE, driverkit.ReasonMountDisconnected)}, want: control.Gone},
		"a hung mount":        {findings: []driverkit.Finding{finding(csi.VolumeHealthErrorType_INACCESSIBLE, driverkit.ReasonMountHung)}, want: control.Hung},
		"a read-only mount":   {findings: []driverkit.Finding{finding(csi.VolumeHealthErrorType_DEGRADED, driverkit.ReasonReadOnlyMount)}, want: control.ReadOnly},
		"lost over gone":      {findings: []driverkit.Finding{finding(csi.VolumeHealthErrorType_INACCESSIBLE, driverkit.ReasonMountGone), finding(csi.VolumeHealthErrorType_DATA_LOSS, driverkit.ReasonDataLoss)}, want: control.Lost},
		"hung over read-only": {findings: []driverkit.Finding{finding(csi.VolumeHealthErrorType_DEGRADED, driverkit.ReasonReadOnlyMount), finding(csi.VolumeHealthErrorType_INACCESSIBLE, driverkit.ReasonMountHung)}, want: control.Hung},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := conditionOf(tt.findings); got != tt.want {
				t.Errorf("conditionOf(%v) = %q, want %q", tt.findings, got, tt.want)
			}
		})
	}
}

// TestIsMounterOf checks that a recorded PID is only signalled while it is still the volume's
// mounter: after an exit, or for another volume's mounter, it is not.
func TestIsMounterOf(t *testing.T) {
	r := &record{VolumeID: "vol-1", StagingPath: "/staging/vol-1", FsName: "d:vol-1"}
	// sh runs sleep and keeps the flags as its own arguments, as a mounter's command line has them.
	// The script does not end with the sleep, so that the shell waits for it instead of replacing
	// itself with it (as dash does with a script's last command), which would drop the flags.
	cmd := exec.Command("/bin/sh", "-c", "sleep 60; exit 0", "mounter", "--target", r.StagingPath, "--fsname", r.FsName)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	// Start returns once the child began to exec, possibly before the kernel has set up its new
	// command line: wait for it.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); err == nil && bytes.HasPrefix(b, []byte("/bin/sh\x00")) {
			break
		}
	}

	if !isMounterOf(pid, r) {
		t.Errorf("the volume's mounter is not recognised")
	}
	other := r.clone()
	other.FsName = "d:vol-2"
	if isMounterOf(pid, other) {
		t.Errorf("another volume's mounter passes for this one's")
	}
	if isMounterOf(0, r) || isMounterOf(-pid, r) {
		t.Errorf("PID 0 or a process group passes for a mounter")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if isMounterOf(pid, r) {
		t.Errorf("a mounter that exited still counts")
	}
}

func TestStoreKeepsRecords(t *testing.T) {
	s := store{dir: t.TempDir()}
	if err := s.init(); err != nil {
		t.Fatal(err)
	}
	r := &record{VolumeID: "a/b c", StagingPath: "/staging", FsName: "d:x",
		PublishTargets: []target{{Path: "/t1"}, {Path: "/t2", ReadOnly: true}}, MounterPID: 42}
	if err := s.saveRecord(r); err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(s.recordFile(r.VolumeID)) != s.stagedDir() {
		t.Errorf("the record of %q is written outside %s: %s", r.VolumeID, s.stagedDir(), s.recordFile(r.VolumeID))
	}
	got, err := s.records()
	if err != nil {
		t.Fatal(err)
	}
	if g := got[r.VolumeID]; g == nil || g.MounterPID != 42 || len(g.PublishTargets) != 2 || !g.PublishTargets[1].ReadOnly {
		t.Errorf("records() = %+v, want %+v back", got, r)
	}
	if err := s.removeRecord(r.VolumeID); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.records(); len(got) != 0 {
		t.Errorf("records() after removeRecord = %+v", got)
	}
}

func TestCountersCountVolumeCalls(t *testing.T) {
	p := &Plugin{counters: control.NewRecorder()}
	call := func(method string, req any, err error) {
		_, _ = p.countCalls(context.Background(), req, &grpc.UnaryServerInfo{FullMethod: method},
			func(context.Context, any) (any, error) { return nil, err })
	}
	probe := &healerv1alpha1.ProbeVolumeRequest{VolumeId: "vol-1"}
	call("/healer.v1alpha1.Healer/ProbeVolume", probe, nil)
	call("/healer.v1alpha1.Healer/ProbeVolume", probe, status.Error(codes.Aborted, "busy"))
	call("/csi.v1.Node/NodeGetInfo", &csi.NodeGetInfoRequest{}, nil)

	c := p.counters.Counters()
	if c.Calls["ProbeVolume"] != 2 || c.Calls["NodeGetInfo"] != 1 {
		t.Errorf("Calls = %v, want 2 ProbeVolume and 1 NodeGetInfo", c.Calls)
	}
	if c.VolumeCalls["vol-1"]["ProbeVolume"] != 2 || c.Aborted["vol-1"] != 1 || c.InFlight != 0 {
		t.Errorf("counters = %+v, want 2 probes of vol-1, 1 aborted, none in flight", c)
	}
	if log := p.counters.Calls(); len(log) != 2 || log[0].End.IsZero() {
		t.Errorf("call log = %+v, want 2 ended calls", log)
	}
}

// WaitStopped lets the package's external tests wait, as a freeze does, until every thread of
// a mounter they stopped themselves has stopped.
var WaitStopped = waitStopped
