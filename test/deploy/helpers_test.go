package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/volume-healer/volume-healer/test/controlplane"
)

// kubeVersion is the Kubernetes version helm renders for: the one hack/control-plane.sh builds.
const kubeVersion = "1.37.2"

// oldestKubeVersion is the oldest Kubernetes version the charts support (their kubeVersion): the
// one `make test-oldest` runs against.
const oldestKubeVersion = "1.30.14"

// vapAPIVersion is the resource the chart's node binding needs (Helm's capability), which helm
// template does not assume: the tests name it for the clusters that have it (kubeVersion).
const vapAPIVersion = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"

// repoRoot returns the module's root folder.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// path returns a path below the module's root.
func path(t *testing.T, elem ...string) string {
	t.Helper()
	return filepath.Join(append([]string{repoRoot(t)}, elem...)...)
}

var (
	toolsOnce sync.Once
	toolPaths map[string]string
	toolsErr  error
)

// tool returns the path of promtool, helm or kustomize, built by hack/tools.sh on first use (several
// minutes once per machine, then cached under .cache/bin).
func tool(t *testing.T, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs promtool, helm and kustomize from hack/tools.sh")
	}
	toolsOnce.Do(func() {
		root, err := controlplane.RepoRoot()
		if err != nil {
			toolsErr = err
			return
		}
		var out, errOut bytes.Buffer
		cmd := exec.Command("bash", filepath.Join(root, "hack", "tools.sh"), "promtool", "helm", "kustomize")
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			toolsErr = errors.New("hack/tools.sh: " + err.Error() + "\n" + errOut.String())
			return
		}
		toolPaths = map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			toolPaths[filepath.Base(line)] = line
		}
	})
	if toolsErr != nil {
		t.Fatal(toolsErr)
	}
	p, ok := toolPaths[name]
	if !ok {
		t.Fatalf("hack/tools.sh did not print the path of %s", name)
	}
	return p
}

// run runs a command in dir and returns its standard output; it fails t with the standard error
// when the command fails.
func run(t *testing.T, dir, name string, args ...string) []byte {
	t.Helper()
	out, err := runErr(dir, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v", filepath.Base(name), strings.Join(args, " "), err)
	}
	return out
}

// runErr runs a command and returns its standard output, or an error holding its standard error.
func runErr(dir, name string, args ...string) ([]byte, error) {
	var out, errOut bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.Bytes(), errors.New(err.Error() + "\n" + errOut.String() + out.String())
	}
	return out.Bytes(), nil
}

// kustomize renders the kustomization in dir.
func kustomize(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	return decode(t, run(t, repoRoot(t), tool(t, "kustomize"), "build", dir))
}

// kustomizeWith renders a kustomization written on the spot into a new folder, for combinations
// deploy/ does not ship as folders (the base with a component).
func kustomizeWith(t *testing.T, kustomization func(dir string) string) []*unstructured.Unstructured {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization(dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	return kustomize(t, dir)
}

// chart is the Helm chart's folder, relative to the module's root.
const chart = "deploy/helm/volume-healer"

// helmTemplate renders the chart as release in namespace with the values files given (relative to
// the module's root) and --set pairs.
func helmTemplate(t *testing.T, release, namespace string, valuesFiles []string, set ...string) []*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", release, chart, "--namespace", namespace, "--kube-version", kubeVersion, "--api-versions", vapAPIVersion}
	for _, f := range valuesFiles {
		args = append(args, "--values", f)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return decode(t, run(t, repoRoot(t), tool(t, "helm"), args...))
}

// decode splits a YAML stream into objects, leaving out empty documents.
func decode(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatalf("decode manifests: %v", err)
		}
		if len(obj) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: obj})
	}
}

// find returns the one object of kind and name in objs, failing t when there is none.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s among the rendered objects", kind, name)
	return nil
}

// ofKind returns the objects of kind.
func ofKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}
