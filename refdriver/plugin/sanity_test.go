package plugin_test

import (
	"bytes"
	"flag"
	"path/filepath"
	"testing"

	csisanity "github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/volume-healer/volume-healer/api/healer/sanity"
)

// TestCSISanity runs csi-sanity's identity, controller and node checks against the plugin's CSI
// socket: real mounts under a temporary folder.
func TestCSISanity(t *testing.T) {
	// Ginkgo, which csi-sanity runs on, ends the whole test process when asked to run more than
	// once, before this test could unmount what it mounted.
	if f := flag.Lookup("test.count"); f != nil && f.Value.String() != "1" {
		t.Skipf("csi-sanity runs its suite once per process; run this test with -count=1 (not %s)", f.Value)
	}
	e := newEnv(t)
	p := e.start()
	cfg := csisanity.NewTestConfig()
	cfg.Address = p.csiEndpoint
	// csi-sanity makes both folders itself and fails when they exist.
	cfg.TargetPath = filepath.Join(e.root, "csi-sanity-target")
	cfg.StagingPath = filepath.Join(e.root, "csi-sanity-staging")
	cfg.TestVolumeSize = 1 << 30
	csisanity.Test(t, cfg)
	e.expectNothingLeft()
}

// TestHealerSanity runs the Healer protocol's conformance checks (healerctl sanity) against the
// plugin's CSI-Addons socket, breaking a staged and published volume for real through the
// control socket.
func TestHealerSanity(t *testing.T) {
	e := newEnv(t)
	p := e.start()
	v := p.createStagePublish(e, "pvc-sanity")
	other := p.createStagePublish(e, "pvc-other")

	var out bytes.Buffer
	report, err := sanity.Run(ctx(t), sanity.Options{
		Endpoint: p.addonsEndpoint,
		VolumeID: v.id,
		Control:  p.control,
		Out:      &out,
	})
	t.Logf("healerctl sanity:\n%s", out.String())
	if err != nil {
		t.Fatalf("sanity.Run: %v", err)
	}
	for _, res := range report.Results {
		if res.Outcome != sanity.Pass {
			t.Errorf("%s", res)
		}
	}
	if err := writeRead(v.target, "after-sanity", "the volume works after the run"); err != nil {
		t.Errorf("write through the target after the run: %v", err)
	}
	p.teardown(v)
	p.teardown(other)
	e.expectNothingLeft()
}
