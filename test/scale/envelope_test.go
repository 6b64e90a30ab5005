package scale

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/volume-healer/volume-healer/test/controlplane"
)

// TestEnvelope runs the envelope's in-process figures: small without -full, at 100,000 and
// 300,000 volumes with it (writing bench/envelope.json and .md). It checks what holds at any
// size; the figures are measured, not asserted.
func TestEnvelope(t *testing.T) {
	layout := ShortEnvelopeLayout()
	isFull := *full || os.Getenv("SCALE_FULL") == "1"
	if isFull {
		layout = FullEnvelopeLayout()
	}
	dir := t.TempDir()
	res, err := RunEnvelope(t.Context(), layout, dir, t.Logf)
	if err != nil {
		t.Fatalf("envelope: %v", err)
	}
	path := *resultsPath
	switch {
	case path != "":
	case isFull:
		root, err := controlplane.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		path = filepath.Join(root, "bench", "envelope.json")
	default:
		path = filepath.Join(dir, "envelope.json")
	}
	if err := res.write(path); err != nil {
		t.Fatal(err)
	}
	t.Logf("results written to %s", path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back EnvelopeResults
	if err := json.Unmarshal(b, &back); err != nil || back.Schema != envelopeSchema {
		t.Fatalf("results file %s: schema %q, %v", path, back.Schema, err)
	}

	checkSweepCPU(t, res.SweepCPU, layout.SweepVolumes)
	if len(res.LargeSweepCPU) != 2 {
		t.Fatalf("large sweep: %d results, want the built-in and the teams policy", len(res.LargeSweepCPU))
	}
	for _, c := range res.LargeSweepCPU {
		if c.Volumes != layout.LargeSweepVolumes || c.Decisions != c.Volumes || c.TasksSubmitted == 0 {
			t.Errorf("large sweep (%s): %d of %d volumes decided, %d to probe; want all %d decided and some to probe",
				c.Policy, c.Decisions, c.Volumes, c.TasksSubmitted, layout.LargeSweepVolumes)
		}
	}
}
