package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/volume-healer/volume-healer/test/controlplane"
	"github.com/volume-healer/volume-healer/test/harness"
)

// Assets are the built pieces a node runs: the binaries' folders and the images.
type Assets struct {
	// ControlPlaneBin and NodeBin are the folders of hack/control-plane.sh and hack/node.sh.
	ControlPlaneBin, NodeBin string
	// Images maps each image's name (volume-healer, healer-sidecar, healer-refdriver,
	// healer-test-pause, healer-test-workload, csi-provisioner, csi-attacher, csi-addons-sidecar)
	// to its archive and reference.
	Images map[string]Image
}

// Image is one built image.
type Image struct {
	// Archive is the OCI archive to import into containerd.
	Archive string
	// Repository and Tag are the name pods use ("healer-refdriver", "v0.1.0"); Ref is the name
	// containerd gives it once imported ("docker.io/library/healer-refdriver:v0.1.0").
	Repository, Tag, Ref string
}

// Options returns the Options for a node in dir that runs these assets.
func (a Assets) Options(dir string) Options {
	return Options{Dir: dir, ControlPlaneBin: a.ControlPlaneBin, NodeBin: a.NodeBin, SandboxImage: a.Images["healer-test-pause"]}
}

// Prepare builds (or finds in .cache/) everything a node needs: the control plane
// (hack/control-plane.sh), the node's binaries (hack/node.sh), the csi-addons sidecar
// (hack/csi-addons-sidecar.sh) and the images, the project's and the node's own (hack/images
// --cluster-images), for this machine's platform, in .cache/cluster-images.
func Prepare(ctx context.Context, logf func(string, ...any)) (Assets, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return Assets{}, err
	}
	var a Assets
	if a.ControlPlaneBin, err = controlplane.Assets(); err != nil {
		return a, err
	}
	start := time.Now()
	if a.NodeBin, err = script(ctx, root, "hack/node.sh"); err != nil {
		return a, err
	}
	logf("cluster: node binaries ready in %s (%s)", time.Since(start).Round(time.Second), a.NodeBin)
	start = time.Now()
	csiAddons, err := harness.BuildCSIAddonsSidecar()
	if err != nil {
		return a, err
	}
	logf("cluster: csi-addons sidecar ready in %s (%s)", time.Since(start).Round(time.Second), csiAddons)
	start = time.Now()
	out := filepath.Join(root, ".cache", "cluster-images")
	cmd := exec.CommandContext(ctx, "go", "run", "./hack/images", "--platforms", "linux/"+goarch(), "--out", out,
		"--cluster-images", a.NodeBin, "--csi-addons-sidecar", csiAddons)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return a, fmt.Errorf("hack/images --cluster-images: %w\n%s", err, b)
	}
	logf("cluster: images ready in %s (%s)", time.Since(start).Round(time.Second), out)
	raw, err := os.ReadFile(filepath.Join(out, "images.json"))
	if err != nil {
		return a, err
	}
	var built []struct {
		Name, Ref, Tarball string
	}
	if err := json.Unmarshal(raw, &built); err != nil {
		return a, fmt.Errorf("%s: %w", filepath.Join(out, "images.json"), err)
	}
	a.Images = map[string]Image{}
	for _, b := range built {
		repo, tag, _ := strings.Cut(b.Ref, ":")
		a.Images[b.Name] = Image{Archive: b.Tarball, Repository: repo, Tag: tag, Ref: "docker.io/library/" + b.Ref}
	}
	return a, nil
}

// script runs a hack/ script that prints a folder on its last line.
func script(ctx context.Context, root, name string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(root, name))
	cmd.Dir = root
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w\n%s", name, err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}

func goarch() string { return runtime.GOARCH }
