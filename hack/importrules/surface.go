package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// surfacePatterns are the packages a driver imports: the public surface of the module.
var surfacePatterns = []string{"api/...", "driverkit/..."}

// An allowedModule is a module that a driver's build may need because it imports the public
// surface, and why.
type allowedModule struct {
	Path   string
	Reason string
}

// surfaceModules are all the modules a driver that imports every package of the public surface
// needs, besides this module. docs/driver-authors.md lists them for driver authors.
var surfaceModules = []allowedModule{
	{"google.golang.org/grpc", "the Healer and CSI-Addons Identity services are gRPC services"},
	{"google.golang.org/protobuf", "their messages (the generated code of api/healer/v1alpha1)"},
	{"google.golang.org/genproto/googleapis/rpc", "gRPC's status details (grpc)"},
	{"github.com/container-storage-interface/spec", "the CSI types and VolumeHealth vocabulary"},
	{"github.com/csi-addons/spec", "the CSI-Addons Identity service driverkit serves"},
	{"k8s.io/mount-utils", "driverkit's mount checks and mounts"},
	{"github.com/moby/sys/mountinfo", "the mount table (mount-utils)"},
	{"golang.org/x/sys", "system calls (driverkit, mount-utils, grpc)"},
	{"github.com/hanwen/go-fuse/v2", "the FUSE protocol's wire structures (driverkit/fuseconn)"},
	{"golang.org/x/net", "HTTP/2 (grpc)"},
	{"golang.org/x/text", "IDNA, through HTTP/2 (grpc)"},
	{"k8s.io/klog/v2", "logging (mount-utils)"},
	{"github.com/go-logr/logr", "driverkit's logger, klog's too"},
	{"k8s.io/utils", "exec and I/O helpers (mount-utils)"},
	{"k8s.io/kubelet", "kubelet's plugin registration API (driverkit.RegisterWithKubelet)"},
}

// A requirement is one line of a go.mod's require blocks.
type requirement struct {
	Path     string
	Version  string
	Indirect bool
}

// checkSurface writes a driver module in a temporary folder that imports every package of the
// public surface from root's module (through a replace directive), resolves its requirements with
// go mod tidy from the module cache alone, builds it, and returns what it requires beyond
// surfaceModules, and what surfaceModules names that it no longer needs.
func checkSurface(root, module string) ([]string, error) {
	env, err := offlineEnv(root)
	if err != nil {
		return nil, err
	}
	patterns := make([]string, len(surfacePatterns))
	for i, p := range surfacePatterns {
		patterns[i] = module + "/" + p
	}
	out, err := goList(root, env, append([]string{"list"}, patterns...)...)
	if err != nil {
		return nil, err
	}
	imports := strings.Fields(string(out))
	goVersion, err := goDirective(root, env)
	if err != nil {
		return nil, err
	}

	dir, err := os.MkdirTemp("", "driver-module-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var main strings.Builder
	main.WriteString("// Command driver imports the whole public surface of " + module + ".\npackage main\n\nimport (\n")
	for _, p := range imports {
		fmt.Fprintf(&main, "\t_ %q\n", p)
	}
	main.WriteString(")\n\nfunc main() {}\n")
	gomod := fmt.Sprintf("module example.com/driver\n\ngo %s\n\nrequire %s v0.0.0\n\nreplace %s => %s\n", goVersion, module, module, root)
	// The module's own checksums: every module the driver can need is among them, and go mod
	// tidy keeps only those it uses.
	sums, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		return nil, err
	}
	for name, data := range map[string][]byte{"main.go": []byte(main.String()), "go.mod": []byte(gomod), "go.sum": sums} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return nil, err
		}
	}
	if _, err := goList(dir, env, "mod", "tidy"); err != nil {
		return nil, err
	}
	if _, err := goList(dir, env, "build", "-o", filepath.Join(dir, "driver"), "."); err != nil {
		return nil, err
	}
	reqs, err := requirements(dir, env)
	if err != nil {
		return nil, err
	}
	_, graph, err := loadGraph(dir, env, false, ".")
	if err != nil {
		return nil, err
	}
	return compareRequirements(module, reqs, surfaceModules, func(mod string) []string {
		return chainToModule(graph, "example.com/driver", mod)
	}), nil
}

// offlineEnv is the environment of the go commands of the surface check: the module cache only,
// and the -mod=mod that go mod tidy's resolution needs on top of the configured GOFLAGS.
func offlineEnv(root string) ([]string, error) {
	flags, err := goList(root, nil, "env", "GOFLAGS")
	if err != nil {
		return nil, err
	}
	return append(os.Environ(),
		"GOFLAGS="+strings.TrimSpace(strings.TrimSpace(string(flags))+" -mod=mod"),
		"GOPROXY=off", "GOWORK=off"), nil
}

// goDirective is the go version the module at dir declares.
func goDirective(dir string, env []string) (string, error) {
	out, err := goList(dir, env, "mod", "edit", "-json")
	if err != nil {
		return "", err
	}
	var mod struct{ Go string }
	if err := json.Unmarshal(out, &mod); err != nil {
		return "", fmt.Errorf("reading go.mod in %s: %w", dir, err)
	}
	return mod.Go, nil
}

// requirements are the require lines of the go.mod at dir.
func requirements(dir string, env []string) ([]requirement, error) {
	out, err := goList(dir, env, "mod", "edit", "-json")
	if err != nil {
		return nil, err
	}
	var mod struct{ Require []requirement }
	if err := json.Unmarshal(out, &mod); err != nil {
		return nil, fmt.Errorf("reading go.mod in %s: %w", dir, err)
	}
	return mod.Require, nil
}

// compareRequirements checks the tidy go.mod of a driver that imports the public surface of module:
// it requires module directly and nothing else directly, and of the rest only allowed modules. It
// also names allowed modules the driver no longer needs, so that the list (and the documentation
// that gives it to driver authors) stays exact. chain gives the imports that bring a module in.
func compareRequirements(module string, reqs []requirement, allowed []allowedModule, chain func(string) []string) []string {
	ok := make(map[string]bool, len(allowed))
	for _, a := range allowed {
		ok[a.Path] = true
	}
	var problems []string
	required := map[string]bool{}
	for _, r := range reqs {
		required[r.Path] = true
		switch {
		case r.Path == module:
			if r.Indirect {
				problems = append(problems, fmt.Sprintf("the driver module requires %s as indirect", module))
			}
		case !ok[r.Path]:
			problems = append(problems, fmt.Sprintf("importing %s requires %s %s, which is not in the allowed modules (hack/importrules/surface.go); it comes in through %s",
				strings.Join(surfacePatterns, " and "), r.Path, r.Version, strings.Join(chain(r.Path), " -> ")))
		case !r.Indirect:
			problems = append(problems, fmt.Sprintf("the driver module requires %s directly, though it imports only %s", r.Path, module))
		}
	}
	if !required[module] {
		problems = append(problems, fmt.Sprintf("the driver module does not require %s", module))
	}
	for _, a := range allowed {
		if !required[a.Path] {
			problems = append(problems, fmt.Sprintf("%s is an allowed module that importing %s no longer needs: drop it from hack/importrules/surface.go and docs/driver-authors.md",
				a.Path, strings.Join(surfacePatterns, " and ")))
		}
	}
	sort.Strings(problems)
	return problems
}

// chainToModule is the shortest chain of imports from the package from to a package of module mod.
func chainToModule(pkgs []Package, from, mod string) []string {
	byID := make(map[string]Package, len(pkgs))
	for _, p := range pkgs {
		byID[p.ID] = p
	}
	start, ok := byID[from]
	if !ok {
		return []string{"(" + from + " not listed)"}
	}
	start.Of = start.Path
	vs := reach(byID, start, false, func(path string) bool {
		p, ok := byID[path]
		return ok && p.Module == mod
	})
	if len(vs) == 0 {
		return []string{"(no import: a requirement of the module graph only)"}
	}
	return vs[0].Chain
}
