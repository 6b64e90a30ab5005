package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"

	"github.com/volume-healer/volume-healer/hack/filelock"
	"github.com/volume-healer/volume-healer/test/controlplane"
)

// Flavor is how the controller is built.
type Flavor string

const (
	// Plain is a normal build: the controller as it ships.
	Plain Flavor = "plain"
	// Race adds the race detector; the log of a controller built so reports a data race with
	// RaceReport.
	Race Flavor = "race"
	// Profiling adds a net/http/pprof endpoint on the address in ProfileAddressEnv, through a
	// build overlay: the source tree holds no such code.
	Profiling Flavor = "profiling"
)

// ProfileAddressEnv names the variable that turns on the net/http/pprof endpoint of a Profiling
// build; StartController sets it with ControllerOptions.Profile.
const ProfileAddressEnv = "HARNESS_PPROF_ADDRESS"

// RaceReport starts the race detector's report of a data race.
const RaceReport = "WARNING: DATA RACE"

// profilingSource is the file the Profiling build adds to the controller's main package.
const profilingSource = `package main

import (
	"net/http"
	_ "net/http/pprof"
	"os"
)

func init() {
	if addr := os.Getenv("` + ProfileAddressEnv + `"); addr != "" {
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
}
`

// BuildOptions say which programs to build.
type BuildOptions struct {
	// Controller is the flavor of cmd/volume-healer. Default: Plain.
	Controller Flavor
	// NodePlugin also builds cmd/healer-sidecar and cmd/refdriver, always Plain: a suite runs
	// many of them, which the race detector's cost would not let fit on a small machine.
	NodePlugin bool
	// Healerctl also builds cmd/healerctl, Plain.
	Healerctl bool
}

// Binaries are the paths of built programs; a program not asked for is "".
type Binaries struct {
	Controller, Sidecar, Driver, Healerctl string
}

// BinDir is the folder, below the module root, that Build builds into: one subfolder per flavor.
const BinDir = ".cache/test-bin"

// Build builds the programs o asks for into BinDir of the module root, and returns their paths.
//
// Every suite of a run builds into the same folder, one at a time (a file lock serializes the
// test binaries that go test runs in parallel), so that each program is compiled and linked once
// per run: the go command finds the binary that the first build left up to date, and the later
// builds take well under a second. A binary that must change is renamed into place, so that a
// process started from the old file keeps running and one started after finds a whole file.
func Build(o BuildOptions) (Binaries, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return Binaries{}, err
	}
	dir := filepath.Join(root, BinDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Binaries{}, err
	}
	unlock, err := filelock.Lock(filepath.Join(dir, ".lock"))
	if err != nil {
		return Binaries{}, err
	}
	defer unlock()

	flavor := o.Controller
	if flavor == "" {
		flavor = Plain
	}
	var b Binaries
	if b.Controller, err = build(root, dir, flavor, "./cmd/volume-healer"); err != nil {
		return Binaries{}, err
	}
	if o.NodePlugin {
		if b.Sidecar, err = build(root, dir, Plain, "./cmd/healer-sidecar", "./cmd/refdriver"); err != nil {
			return Binaries{}, err
		}
		b.Driver = filepath.Join(filepath.Dir(b.Sidecar), "refdriver")
	}
	if o.Healerctl {
		if b.Healerctl, err = build(root, dir, Plain, "./cmd/healerctl"); err != nil {
			return Binaries{}, err
		}
	}
	return b, nil
}

// BuildDriver builds cmd/refdriver alone, in flavor (Plain, or Race for tests that run with the
// race detector and want it in the driver too), into BinDir as Build builds the other programs,
// once per run, and returns its path.
func BuildDriver(flavor Flavor) (string, error) { return buildProgram("./cmd/refdriver", flavor) }

// BuildWorkload builds test/workload, the workload stand-in that test/kubelet's StartWorkload
// runs in a mount namespace of its own, into BinDir as Build builds the other programs, once per
// run, and returns its path.
func BuildWorkload() (string, error) { return buildProgram("./test/workload", Plain) }

// BuildContainer builds test/container, which StartContainer runs a program through as a pod's
// container, into BinDir as Build builds the other programs, once per run, and returns its path.
func BuildContainer() (string, error) { return buildProgram("./test/container", Plain) }

// buildProgram builds the main package pkg in flavor into BinDir/<flavor> and returns its path.
func buildProgram(pkg string, flavor Flavor) (string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, BinDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	unlock, err := filelock.Lock(filepath.Join(dir, ".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	return build(root, dir, flavor, pkg)
}

// build builds the main packages pkgs in flavor into dir/flavor and returns the path of the
// first one's binary. The go command finds a binary there up to date and leaves it as it is;
// otherwise it links a new one in its work folder, which GOTMPDIR puts on the same file system,
// and renames it into place.
func build(root, dir string, flavor Flavor, pkgs ...string) (string, error) {
	out := filepath.Join(dir, string(flavor))
	work := filepath.Join(dir, "tmp")
	for _, d := range []string{out, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	args := []string{"build", "-o", out + string(filepath.Separator)}
	switch flavor {
	case Plain:
	case Race:
		args = append(args, "-race")
	case Profiling:
		overlay, err := profilingOverlay(root, dir)
		if err != nil {
			return "", err
		}
		args = append(args, "-overlay", overlay)
	default:
		return "", fmt.Errorf("unknown build flavor %q", flavor)
	}
	cmd := exec.Command("go", append(args, pkgs...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOTMPDIR="+work)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %v: %w\n%s", args, err, b)
	}
	return filepath.Join(out, path.Base(pkgs[0])), nil
}

// profilingOverlay writes profilingSource and an overlay that adds it to cmd/volume-healer, and
// returns the overlay's path. Both keep their paths from build to build, so that the go command
// finds the build up to date.
func profilingOverlay(root, dir string) (string, error) {
	src := filepath.Join(dir, "profiling", "zz_harness_pprof.go.src")
	if err := os.MkdirAll(filepath.Dir(src), 0o755); err != nil {
		return "", err
	}
	if err := writeIfChanged(src, []byte(profilingSource)); err != nil {
		return "", err
	}
	overlay := fmt.Sprintf(`{"Replace": {%q: %q}}`, filepath.Join(root, "cmd", "volume-healer", "zz_harness_pprof.go"), src)
	file := filepath.Join(dir, "profiling", "overlay.json")
	return file, writeIfChanged(file, []byte(overlay))
}

func writeIfChanged(file string, data []byte) error {
	if old, err := os.ReadFile(file); err == nil && string(old) == string(data) {
		return nil
	}
	return os.WriteFile(file, data, 0o644)
}
