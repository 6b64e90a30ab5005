package main

import (
	"context"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/test/harness"
)

// TestDemo runs the demo end to end on a small cluster, so that `make demo` cannot rot: the
// controller as a process, real sidecars and reference drivers, a node plugin restart healed, a
// periodic sweep's heal, and healerctl status at the end. run fails unless every healable broken
// volume is healed and healerctl status lists the restart as handled and the volume whose data is
// lost as needing a human, with exit code 2.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the controller and runs a control plane")
	}
	bin, err := harness.Build(harness.BuildOptions{Healerctl: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := run(ctx, options{nodes: 2, volumes: 8, controller: bin.Controller, healerctl: bin.Healerctl, dir: t.TempDir(), timeout: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
}
