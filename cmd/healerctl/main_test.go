package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/volume-healer/volume-healer/"

// TestLinksNoDriverNorTestPackage holds healerctl to its package doc: `healerctl sanity` talks
// to a driver over its CSI-Addons socket and the control endpoint of api/healer/sanity, so the
// binary links no package of a driver (the reference driver under refdriver/, driverkit) and
// nothing under test/.
func TestLinksNoDriverNorTestPackage(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	// The list is the real one: it holds what healerctl sanity does link.
	if !slices.Contains(deps, module+"api/healer/sanity") {
		t.Fatalf("go list -deps names no %sapi/healer/sanity; got %d packages", module, len(deps))
	}
	for _, dep := range deps {
		for _, banned := range []string{"refdriver", "driverkit", "test"} {
			if dep == module+banned || strings.HasPrefix(dep, module+banned+"/") {
				t.Errorf("healerctl links %s; it must reach drivers through their sockets only", dep)
			}
		}
	}
}
