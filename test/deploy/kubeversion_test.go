package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestChartNodeBindingFollowsTheCluster renders the chart, with the sidecar's cluster side, for
// the clusters Helm would see: Kubernetes 1.37 with ValidatingAdmissionPolicies gets the node
// binding (the policy and its binding) and no warning; the oldest supported version, whose tokens
// need not name their node, and a 1.37 cluster without the policy API get neither object and the
// warning in NOTES.txt; a version older than the oldest supported is refused.
func TestChartNodeBindingFollowsTheCluster(t *testing.T) {
	helm := tool(t, "helm")
	const warning = "WARNING: this cluster (Kubernetes "
	const anyWarning = "csiaddonsnode-node was not installed"
	for name, tc := range map[string]struct {
		kubeVersion string
		apiVersions []string
		mode        string
		binding     bool
	}{
		"1.37 with ValidatingAdmissionPolicies": {kubeVersion, []string{vapAPIVersion}, "auto", true},
		"oldest supported, 1.30":                {oldestKubeVersion, []string{vapAPIVersion}, "auto", false},
		"1.31, the last without the claim":      {"1.31.14", []string{vapAPIVersion}, "auto", false},
		"1.37 without the policy API":           {kubeVersion, nil, "auto", false},
		"1.30 with nodeBinding always":          {oldestKubeVersion, []string{vapAPIVersion}, "always", true},
		"1.37 with nodeBinding never":           {kubeVersion, []string{vapAPIVersion}, "never", false},
	} {
		t.Run(name, func(t *testing.T) {
			args := []string{"--kube-version", tc.kubeVersion, "--set", "sidecar.nodeBinding=" + tc.mode}
			for _, v := range tc.apiVersions {
				args = append(args, "--api-versions", v)
			}
			objs := decode(t, run(t, repoRoot(t), helm, append([]string{"template", "storage-healer", chart,
				"--namespace", "healer-system", "--values", fullValues}, args...)...))
			for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
				got := len(ofKind(objs, kind))
				if tc.binding && got != 1 {
					t.Errorf("Kubernetes %s %v: %d %ss, want the node binding's one", tc.kubeVersion, tc.apiVersions, got, kind)
				}
				if !tc.binding && got != 0 {
					t.Errorf("Kubernetes %s %v: %d %ss, want none: the cluster would refuse every node plugin's write", tc.kubeVersion, tc.apiVersions, got, kind)
				}
			}
			// The sidecar's other cluster objects are there either way.
			find(t, objs, "ClusterRole", "storage-healer-volume-healer-sidecar")

			notes := renderNotes(t, helm, append([]string{"--values", fullValues}, args...)...)
			switch {
			case tc.binding && strings.Contains(notes, anyWarning):
				t.Errorf("Kubernetes %s %v: NOTES.txt warns of a missing node binding that is installed:\n%s", tc.kubeVersion, tc.apiVersions, notes)
			case !tc.binding && tc.mode == "never" && !strings.Contains(notes, "WARNING: sidecar.nodeBinding is never"):
				t.Errorf("nodeBinding never: NOTES.txt does not warn that the node binding is left out:\n%s", notes)
			case !tc.binding && tc.mode == "auto" && !strings.Contains(notes, warning+"v"+tc.kubeVersion+") cannot hold the node binding"):
				t.Errorf("Kubernetes %s %v: NOTES.txt does not warn that the node binding is missing:\n%s", tc.kubeVersion, tc.apiVersions, notes)
			case !tc.binding && !strings.Contains(notes, "storage-healer-volume-healer-csiaddonsnode-node was not installed"):
				t.Errorf("NOTES.txt does not name the policy left out:\n%s", notes)
			}
		})
	}

	t.Run("without the sidecar no warning", func(t *testing.T) {
		if notes := renderNotes(t, helm, "--kube-version", oldestKubeVersion); strings.Contains(notes, anyWarning) {
			t.Errorf("NOTES.txt warns of the node binding without sidecar.enabled:\n%s", notes)
		}
	})

	t.Run("older than supported", func(t *testing.T) {
		for _, c := range []string{chart, refdriverChart} {
			_, err := runErr(repoRoot(t), helm, "template", "rel", c, "--kube-version", "1.29.6")
			if err == nil || !strings.Contains(err.Error(), "chart requires kubeVersion: >=1.30.0-0 which is incompatible with Kubernetes v1.29.6") {
				t.Errorf("helm template %s for Kubernetes 1.29.6: %v, want the chart's kubeVersion refusal", c, err)
			}
		}
	})
}

// renderNotes renders the chart's NOTES.txt with helm template's flags, which helm template alone
// does not print: a copy of the chart carries the notes as a named template and prints them
// through a ConfigMap.
func renderNotes(t *testing.T, helm string, args ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "chart")
	if err := os.CopyFS(dir, os.DirFS(path(t, chart))); err != nil {
		t.Fatal(err)
	}
	notesFile := filepath.Join(dir, "templates", "NOTES.txt")
	notes, err := os.ReadFile(notesFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(notesFile); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"_test-notes.tpl": `{{- define "test.notes" -}}` + "\n" + string(notes) + "\n{{- end }}",
		"test-notes.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: test-notes\ndata:\n  notes: {{ include \"test.notes\" . | toJson }}\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, "templates", name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := run(t, repoRoot(t), helm, append([]string{"template", "storage-healer", dir, "--namespace", "healer-system",
		"--show-only", "templates/test-notes.yaml"}, args...)...)
	objs := decode(t, out)
	if len(objs) != 1 {
		t.Fatalf("rendering NOTES.txt: %d objects, want one:\n%s", len(objs), out)
	}
	text, _, _ := unstructured.NestedString(objs[0].Object, "data", "notes")
	if !strings.Contains(text, "is installed in namespace healer-system") {
		t.Fatalf("rendered NOTES.txt lacks its first line:\n%s", text)
	}
	return text
}

// TestKustomizeWithoutNodeBinding: the component for clusters older than 1.32 takes the node
// binding, and nothing else, out of a node plugin kustomization that uses deploy/sidecar.
func TestKustomizeWithoutNodeBinding(t *testing.T) {
	with := kustomizeWith(t, func(dir string) string {
		rel := func(elem ...string) string {
			r, err := filepath.Rel(dir, path(t, elem...))
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		return fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\ncomponents:\n  - %s\n",
			rel("deploy", "examples", "ceph-csi-rbd"), rel("deploy", "components", "without-node-binding"))
	})
	without := kustomize(t, "deploy/examples/ceph-csi-rbd")
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		find(t, without, kind, "volume-healer-csiaddonsnode-node")
		if got := ofKind(with, kind); len(got) != 0 {
			t.Errorf("with the component: %d %ss, want none", len(got), kind)
		}
	}
	if len(with) != len(without)-2 {
		t.Errorf("the component left %d objects of %d, want all but the policy and its binding", len(with), len(without))
	}
	find(t, with, "DaemonSet", "csi-rbdplugin")
}

// TestOldestKubeVersionIsOneEverywhere: the release make test-oldest builds and tests against is
// the one the charts require at least, and the one these tests render for.
func TestOldestKubeVersionIsOneEverywhere(t *testing.T) {
	makefile, err := os.ReadFile(path(t, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "OLDEST_KUBE_VERSION ?= v" + oldestKubeVersion + "\n"; !strings.Contains(string(makefile), want) {
		t.Errorf("the Makefile does not say %q", strings.TrimSpace(want))
	}
	minor := oldestKubeVersion[:strings.LastIndex(oldestKubeVersion, ".")]
	for _, c := range []string{chart, refdriverChart} {
		data, err := os.ReadFile(path(t, c, "Chart.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if want := `kubeVersion: ">=` + minor + `.0-0"`; !strings.Contains(string(data), want+"\n") {
			t.Errorf("%s/Chart.yaml does not say %s, the oldest release tested", c, want)
		}
	}
}
