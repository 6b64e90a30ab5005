package deploy

import (
	"os"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// releaseVersion reads the VERSION file: the release version without its "v".
func releaseVersion(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(path(t, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(raw))
}

// containerImage returns the image of the named container of the workload obj.
func containerImage(t *testing.T, obj *unstructured.Unstructured, container string) string {
	t.Helper()
	containers, _, err := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range containers {
		m := c.(map[string]any)
		if m["name"] == container {
			image, _ := m["image"].(string)
			return image
		}
	}
	t.Fatalf("%s %s has no container %s", obj.GetKind(), obj.GetName(), container)
	return ""
}

// TestVersionsFollowTheVersionFile checks that what deploy/ installs is the release of the
// VERSION file: the chart's version and appVersion, and the image tags of the kustomize base and
// the sidecar component (which make images builds). hack/set-version.sh changes them together.
func TestVersionsFollowTheVersionFile(t *testing.T) {
	v := releaseVersion(t)
	tag := "v" + v
	fix := "; run hack/set-version.sh " + v + " to bring every file to the VERSION file's"

	for _, chart := range []string{chart, "deploy/helm/healer-refdriver"} {
		raw, err := os.ReadFile(path(t, chart, "Chart.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var meta struct {
			Version    string `json:"version"`
			AppVersion string `json:"appVersion"`
		}
		if err := yaml.Unmarshal(raw, &meta); err != nil {
			t.Fatal(err)
		}
		if meta.Version != v || meta.AppVersion != tag {
			t.Errorf("%s/Chart.yaml: version %q, appVersion %q; VERSION says %s, so %q and %q%s", chart, meta.Version, meta.AppVersion, v, v, tag, fix)
		}
	}

	for _, tc := range []struct{ render, kind, name, container, want string }{
		{"deploy/base", "Deployment", "volume-healer", "controller", "volume-healer:" + tag},
		{"deploy/examples/ceph-csi-rbd", "DaemonSet", "csi-rbdplugin", "healer-sidecar", "healer-sidecar:" + tag},
	} {
		objs := kustomize(t, tc.render)
		if got := containerImage(t, find(t, objs, tc.kind, tc.name), tc.container); got != tc.want {
			t.Errorf("kustomize build %s: container %s runs %s, want %s%s", tc.render, tc.container, got, tc.want, fix)
		}
	}
	dep := find(t, helmTemplate(t, "volume-healer", "volume-healer", nil), "Deployment", "volume-healer")
	if got := containerImage(t, dep, "controller"); got != "volume-healer:"+tag {
		t.Errorf("helm template with default values: the controller runs %s, want volume-healer:%s", got, tag)
	}
}

// TestChartImageByDigest checks the chart's image values: a digest pulls by digest, else the tag,
// else the chart's appVersion.
func TestChartImageByDigest(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	tag := "v" + releaseVersion(t)
	for name, tc := range map[string]struct {
		set  []string
		want string
	}{
		"defaults":        {want: "volume-healer:" + tag},
		"a tag":           {set: []string{"image.tag=v9.9.9"}, want: "volume-healer:v9.9.9"},
		"a digest":        {set: []string{"image.repository=registry.example.com/storage/volume-healer", "image.digest=" + digest}, want: "registry.example.com/storage/volume-healer@" + digest},
		"a digest wins":   {set: []string{"image.tag=v9.9.9", "image.digest=" + digest}, want: "volume-healer@" + digest},
		"another release": {set: []string{"image.repository=mirror.example.com/vh"}, want: "mirror.example.com/vh:" + tag},
	} {
		t.Run(name, func(t *testing.T) {
			dep := find(t, helmTemplate(t, "volume-healer", "volume-healer", nil, tc.set...), "Deployment", "volume-healer")
			if got := containerImage(t, dep, "controller"); got != tc.want {
				t.Errorf("image %s, want %s", got, tc.want)
			}
		})
	}
}
