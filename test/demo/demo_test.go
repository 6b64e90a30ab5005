package main

import (
	"context"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/test/harness"
)

// TestDemo runs the demo end to end on a small cluster, so that `make demo` cannot rot: the
// controller as a process, real sidecars and reference drivers, a node plugin restart healed and a
// periodic sweep's heal. run fails unless every healable broken volume is healed.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the controller and runs a control plane")
	}
	bin, err := harness.Build(harness.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := run(ctx, options{nodes: 2, volumes: 8, controller: bin.Controller, dir: t.TempDir(), timeout: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
}
