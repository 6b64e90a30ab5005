package deploy

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// registry stands for the operator's registry in docs/operations.md.
const registry = "registry.example.com/storage"

// walkthrough are the commands of docs/operations.md's "Install from this repository" that need
// neither a registry nor a kubelet, in their order there; the test runs them as they are written,
// in one shell, from the repository's root (the last two in the node plugin's kustomization).
var walkthrough = []string{
	"make images",
	". .cache/images/digests.env",
	"REGISTRY=" + registry,
	"kubectl create namespace volume-healer",
	"kubectl label namespace volume-healer pod-security.kubernetes.io/enforce=restricted",
	`helm template volume-healer deploy/helm/volume-healer --namespace volume-healer --set image.repository="$REGISTRY/volume-healer" --set image.digest="$VOLUME_HEALER_DIGEST" | kubectl apply --server-side --dry-run=server -f -`,
	`kustomize edit set image healer-sidecar="$REGISTRY/healer-sidecar@$HEALER_SIDECAR_DIGEST"`,
	`kubectl apply --server-side --dry-run=server -k .`,
}

// docCommands returns the shell lines of the fenced sh blocks of a Markdown file, with
// continuation lines joined, comments dropped and spaces collapsed.
func docCommands(t *testing.T, file string) []string {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	in, cont := false, ""
	space := regexp.MustCompile(`\s+`)
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```sh"):
			in = true
			continue
		case strings.HasPrefix(line, "```"):
			in = false
			continue
		case !in:
			continue
		}
		if i := strings.Index(line, " # "); i >= 0 {
			line = line[:i]
		}
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cont += strings.TrimSuffix(line, "\\") + " "
			continue
		}
		line = cont + line
		cont = ""
		// A pipe at the end of a line continues the command too.
		if strings.HasSuffix(strings.TrimSpace(line), "|") {
			cont = line + " "
			continue
		}
		if l := strings.TrimSpace(space.ReplaceAllString(line, " ")); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// TestInstallWalkthrough runs the install walk-through of docs/operations.md up to where it needs
// a registry and a kubelet: it builds the images with make images, takes their digests from
// digests.env, renders the chart with the controller's image by digest and the sidecar
// component with the sidecar's, and sends both to a real API server with kubectl's server-side
// dry run. The images' digests must be the ones the objects name.
func TestInstallWalkthrough(t *testing.T) {
	helm, kustomizeBin := tool(t, "helm"), tool(t, "kustomize")
	root := repoRoot(t)

	// The commands are the documentation's.
	doc := docCommands(t, path(t, "docs", "operations.md"))
	pos := 0
	for _, cmd := range walkthrough {
		i := indexFrom(doc, cmd, pos)
		if i < 0 {
			t.Fatalf("docs/operations.md has no command %q after %q: keep the test's walk-through and the page the same", cmd, doc[max(pos-1, 0)])
		}
		pos = i + 1
	}

	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("kubectl is not on the PATH of the CI machine: %v", err)
		}
		t.Skipf("the walk-through applies with kubectl, which this machine lacks: %v", err)
	}

	c := startCluster(t)
	// What the walk-through's reader has already: the Prometheus Operator (and cert-manager), and the node plugin's
	// namespaces (the driver's and its Secrets').
	c.installCRDs(t)
	kubeconfig := c.env.Kubeconfig

	// The node plugin's kustomization, as the walk-through's reader has it: the ceph-csi example,
	// which includes the sidecar component.
	plugin := t.TempDir()
	example, err := filepath.Rel(plugin, path(t, "deploy", "examples", "ceph-csi-rbd"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(plugin, "kustomization.yaml"), "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - "+example+"\n")

	bin := t.TempDir()
	for name, target := range map[string]string{"helm": helm, "kustomize": kustomizeBin, "kubectl": kubectl} {
		if err := os.Symlink(target, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	script := "set -euo pipefail\n" +
		"kubectl create namespace ceph-csi\nkubectl create namespace rook-ceph\n" +
		strings.Join(walkthrough[:len(walkthrough)-2], "\n") + "\n" +
		"cd " + plugin + "\n" +
		strings.Join(walkthrough[len(walkthrough)-2:], "\n") + "\n"
	cmd := exec.CommandContext(t.Context(), "bash", "-c", script)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("the walk-through failed: %v\n%s", err, out.String())
	}
	t.Logf("the walk-through's output:\n%s", out.String())

	// The dry runs admitted every object; they named the images by the digests just built.
	env := readEnv(t, filepath.Join(root, ".cache", "images", "digests.env"))
	for _, name := range []string{"VERSION", "VOLUME_HEALER_DIGEST", "HEALER_SIDECAR_DIGEST"} {
		if !strings.HasPrefix(env[name], map[bool]string{true: "v", false: "sha256:"}[name == "VERSION"]) {
			t.Fatalf("digests.env: %s=%q", name, env[name])
		}
	}
	for _, want := range []string{
		"deployment.apps/volume-healer serverside-applied (server dry run)",
		"daemonset.apps/csi-rbdplugin serverside-applied (server dry run)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the walk-through's output lacks %q", want)
		}
	}
	dep := find(t, helmTemplate(t, "volume-healer", "volume-healer", nil,
		"image.repository="+registry+"/volume-healer", "image.digest="+env["VOLUME_HEALER_DIGEST"]), "Deployment", "volume-healer")
	if got, want := containerImage(t, dep, "controller"), registry+"/volume-healer@"+env["VOLUME_HEALER_DIGEST"]; got != want {
		t.Errorf("the chart runs the controller from %s, want %s", got, want)
	}
	ds := find(t, kustomize(t, plugin), "DaemonSet", "csi-rbdplugin")
	if got, want := containerImage(t, ds, "healer-sidecar"), registry+"/healer-sidecar@"+env["HEALER_SIDECAR_DIGEST"]; got != want {
		t.Errorf("the node plugin runs the sidecar from %s, want %s", got, want)
	}
	if env["VERSION"] != "v"+releaseVersion(t) {
		t.Errorf("digests.env says VERSION=%s, the VERSION file %s", env["VERSION"], releaseVersion(t))
	}
}

func indexFrom(lines []string, want string, from int) int {
	for i := from; i < len(lines); i++ {
		if lines[i] == want {
			return i
		}
	}
	return -1
}

// readEnv reads NAME=value lines.
func readEnv(t *testing.T, file string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is no NAME=value line", file, line)
		}
		out[k] = v
	}
	return out
}
