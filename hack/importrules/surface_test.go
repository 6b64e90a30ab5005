package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestCompareRequirements(t *testing.T) {
	allowed := []allowedModule{{Path: "google.golang.org/grpc"}, {Path: "k8s.io/mount-utils"}}
	chain := func(mod string) []string { return []string{"example.com/driver", "driverkit", mod + "/pkg"} }
	tests := map[string]struct {
		reqs []requirement
		want []string
	}{
		"the module and allowed modules as indirect pass": {
			reqs: []requirement{
				{Path: testModule, Version: "v0.0.0"},
				{Path: "google.golang.org/grpc", Version: "v1.0.0", Indirect: true},
				{Path: "k8s.io/mount-utils", Version: "v0.1.0", Indirect: true},
			},
		},
		"a module outside the allowed ones is named with the imports that bring it": {
			reqs: []requirement{
				{Path: testModule, Version: "v0.0.0"},
				{Path: "google.golang.org/grpc", Version: "v1.0.0", Indirect: true},
				{Path: "k8s.io/mount-utils", Version: "v0.1.0", Indirect: true},
				{Path: "k8s.io/client-go", Version: "v0.37.2", Indirect: true},
			},
			want: []string{"importing api/... and driverkit/... requires k8s.io/client-go v0.37.2, which is not in the allowed modules (hack/importrules/surface.go); it comes in through example.com/driver -> driverkit -> k8s.io/client-go/pkg"},
		},
		"an allowed module no longer needed is named": {
			reqs: []requirement{
				{Path: testModule, Version: "v0.0.0"},
				{Path: "google.golang.org/grpc", Version: "v1.0.0", Indirect: true},
			},
			want: []string{"k8s.io/mount-utils is an allowed module that importing api/... and driverkit/... no longer needs: drop it from hack/importrules/surface.go and docs/driver-authors.md"},
		},
		"the module itself must be required": {
			reqs: []requirement{
				{Path: "google.golang.org/grpc", Version: "v1.0.0", Indirect: true},
				{Path: "k8s.io/mount-utils", Version: "v0.1.0", Indirect: true},
			},
			want: []string{"the driver module does not require " + testModule},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := compareRequirements(testModule, tc.reqs, allowed, chain)
			if !slices.Equal(got, tc.want) {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestDriverAuthorsListTheModules checks that the driver authors' guide names every module the
// public surface may bring into a driver's build, as the surface check allows them.
func TestDriverAuthorsListTheModules(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "driver-authors.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range surfaceModules {
		if !strings.Contains(string(doc), "`"+m.Path+"`") {
			t.Errorf("docs/driver-authors.md does not name the module `%s` (%s)", m.Path, m.Reason)
		}
	}
}
