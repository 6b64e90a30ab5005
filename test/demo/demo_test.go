package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/test/controlplane"
)

// TestDemo runs the demo end to end on a small cluster, so that `make demo` cannot rot: the
// controller as a process, real sidecars and reference drivers, a node plugin restart healed and a
// periodic sweep's heal. run fails unless every healable broken volume is healed.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the controller and runs a control plane")
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "volume-healer")
	build := exec.Command("go", "build", "-o", bin, "./cmd/volume-healer")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the controller: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := run(ctx, options{nodes: 2, volumes: 8, controller: bin, dir: t.TempDir(), timeout: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
}
