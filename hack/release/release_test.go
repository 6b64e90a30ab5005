package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/hack/buildsource"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"sigs.k8s.io/yaml"
)

// krewPlugin is the part of a krew manifest the test reads.
type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version   string `json:"version"`
		Platforms []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			SHA256 string `json:"sha256"`
			Bin    string `json:"bin"`
		} `json:"platforms"`
	} `json:"spec"`
}

// TestReleaseIsReproducible runs the release twice, as make release does (the program built
// without the race detector, which would slow its compression tenfold), into two folders, each
// with a binaries folder of its own so that healerctl is linked twice; the images are built by
// hack/images into one folder, where the second run packs them again from the binaries it finds
// up to date. It asserts that both releases hold the same files with the same bytes, then checks
// what a user of the release relies on.
func TestReleaseIsReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the images, healerctl twice for two platforms, and runs helm and kustomize")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	root, err := buildsource.Git(ctx, ".", "rev-parse", "--show-toplevel")
	if err != nil {
		t.Fatal(err)
	}
	helm, err := toolPath(ctx, root, "helm", "HELM")
	if err != nil {
		t.Fatal(err)
	}
	kustomize, err := toolPath(ctx, root, "kustomize", "KUSTOMIZE")
	if err != nil {
		t.Fatal(err)
	}
	src, err := buildsource.Read(ctx, root, os.Getenv("SOURCE_DATE_EPOCH"))
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	program := filepath.Join(tmp, "release")
	build := exec.CommandContext(ctx, "go", "build", "-o", program, "./hack/release")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./hack/release: %v\n%s", err, out)
	}
	const baseURL = "https://downloads.example.com/volume-healer/v-test"
	run := func(name string) string {
		start := time.Now()
		out := filepath.Join(tmp, name)
		cmd := exec.CommandContext(ctx, program, "--out", out, "--images", filepath.Join(tmp, "images"),
			"--work", filepath.Join(tmp, name+"-work"), "--base-url", baseURL)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "HELM="+helm, "KUSTOMIZE="+kustomize)
		log, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("release %s: %v\n%s", name, err, log)
		}
		t.Logf("release %s in %s:\n%s", name, time.Since(start).Round(100*time.Millisecond), log)
		return out
	}
	a, b := run("a"), run("b")

	filesA, filesB := tree(t, a), tree(t, b)
	if !slices.Equal(slices.Sorted(maps.Keys(filesA)), slices.Sorted(maps.Keys(filesB))) {
		t.Fatalf("the two releases hold different files:\n%v\n%v", slices.Sorted(maps.Keys(filesA)), slices.Sorted(maps.Keys(filesB)))
	}
	for name, sum := range filesA {
		if filesB[name] != sum {
			t.Errorf("%s differs between the two releases: sha256 %s and %s", name, sum, filesB[name])
		}
	}
	wantFiles := []string{SumsFile, "plugin.yaml", "images/images.json", "images/digests.env",
		"kustomize/volume-healer.yaml", "kustomize/healer-sidecar-component-" + src.Version + ".tar.gz"}
	for _, img := range []string{"volume-healer", "healer-sidecar", "healer-refdriver"} {
		wantFiles = append(wantFiles, "images/"+img+".tar")
	}
	for _, c := range Components {
		wantFiles = append(wantFiles, "kustomize/volume-healer-"+c+".yaml")
	}
	for _, c := range Charts {
		wantFiles = append(wantFiles, "charts/"+c+"-"+strings.TrimPrefix(src.Version, "v")+".tgz")
	}
	for _, p := range Platforms {
		wantFiles = append(wantFiles, ArchiveName("healerctl", src.Version, p), ArchiveName("kubectl-healer", src.Version, p))
		for _, bin := range append([]string{"healerctl"}, ImageBinaries...) {
			wantFiles = append(wantFiles, "sbom/"+sbomName(bin, src.Version, p))
		}
	}
	for _, f := range wantFiles {
		if _, ok := filesA[f]; !ok {
			t.Errorf("the release lacks %s", f)
		}
	}
	if len(filesA) != len(wantFiles) {
		t.Errorf("the release holds %d files, want %d: %v", len(filesA), len(wantFiles), slices.Sorted(maps.Keys(filesA)))
	}

	t.Run("checksums", func(t *testing.T) { checkSums(t, a, filesA) })
	work := filepath.Join(tmp, "a-work")
	t.Run("archives", func(t *testing.T) { checkArchives(t, root, a, work, src) })
	t.Run("krew manifest", func(t *testing.T) { checkKrew(t, a, src, baseURL) })
	t.Run("sboms", func(t *testing.T) { checkSBOMs(ctx, t, root, a, work, filepath.Join(tmp, "images"), src) })
	t.Run("charts", func(t *testing.T) { checkCharts(t, a, src) })
	t.Run("kustomize bundle", func(t *testing.T) { checkBundle(t, a, src) })
	t.Run("images", func(t *testing.T) { checkImages(t, a, filepath.Join(tmp, "images")) })
}

// tree maps each file below dir (slash path) to its SHA-256.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		sum, err := fileSHA256(p)
		out[filepath.ToSlash(rel)] = sum
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkSums: SHA256SUMS names every other file with its SHA-256, as sha256sum -c reads it.
func checkSums(t *testing.T, dir string, files map[string]string) {
	lines := strings.Split(strings.TrimSuffix(string(mustRead(t, filepath.Join(dir, SumsFile))), "\n"), "\n")
	if len(lines) != len(files)-1 {
		t.Errorf("%s has %d lines for %d other files", SumsFile, len(lines), len(files)-1)
	}
	for _, line := range lines {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok || files[name] != sum {
			t.Errorf("%s line %q: the file's sha256 is %q", SumsFile, line, files[name])
		}
	}
	if sha, err := exec.LookPath("sha256sum"); err == nil {
		cmd := exec.Command(sha, "--check", "--strict", "--quiet", SumsFile)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("sha256sum --check %s: %v\n%s", SumsFile, err, out)
		}
	}
}

// checkArchives: each archive holds its binary (executable, built for its platform without cgo,
// stamped with the version) and LICENSE, owned by root and dated at the source's time.
func checkArchives(t *testing.T, root, dir, work string, src Source) {
	license := mustRead(t, filepath.Join(root, "LICENSE"))
	for _, p := range Platforms {
		var binaries [][]byte
		for _, name := range []string{"healerctl", "kubectl-healer"} {
			archive := filepath.Join(dir, ArchiveName(name, src.Version, p))
			headers, data := readArchive(t, archive)
			var names []string
			for _, h := range headers {
				names = append(names, h.Name)
				if !h.ModTime.Equal(src.Time) || h.Uid != 0 || h.Gid != 0 {
					t.Errorf("%s: %s dated %s owned by %d:%d, want %s and 0:0", archive, h.Name, h.ModTime, h.Uid, h.Gid, src.Time)
				}
			}
			if !slices.Equal(names, []string{name, "LICENSE"}) {
				t.Fatalf("%s holds %v, want [%s LICENSE]", archive, names, name)
			}
			if headers[0].Mode != 0o755 {
				t.Errorf("%s: %s has mode %o, want 755", archive, name, headers[0].Mode)
			}
			if !bytes.Equal(data["LICENSE"], license) {
				t.Errorf("%s: LICENSE differs from the repository's", archive)
			}
			info, err := buildinfo.Read(bytes.NewReader(data[name]))
			if err != nil {
				t.Fatalf("%s: %s: %v", archive, name, err)
			}
			settings := map[string]string{}
			for _, s := range info.Settings {
				settings[s.Key] = s.Value
			}
			if settings["GOOS"] != p.OS || settings["GOARCH"] != p.Arch || settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" {
				t.Errorf("%s: %s built with %v, want %s, CGO_ENABLED=0 and -trimpath", archive, name, settings, p)
			}
			if info.Path != module+"/cmd/healerctl" {
				t.Errorf("%s: %s is package %s, want cmd/healerctl", archive, name, info.Path)
			}
			if !bytes.Contains(data[name], []byte(src.Version)) || !bytes.Contains(data[name], []byte(src.Commit)) {
				t.Errorf("%s: %s is not stamped with %s and %s", archive, name, src.Version, src.Commit)
			}
			binaries = append(binaries, data[name])
			if p.Arch == runtime.GOARCH && p.OS == runtime.GOOS && name == "kubectl-healer" {
				bin := filepath.Join(t.TempDir(), name)
				if err := os.WriteFile(bin, data[name], 0o755); err != nil {
					t.Fatal(err)
				}
				out, err := exec.Command(bin, "--version").CombinedOutput()
				if err != nil || !strings.Contains(string(out), src.Version) || !strings.Contains(string(out), src.Commit) {
					t.Errorf("%s --version: %v: %s; want %s and %s", name, err, out, src.Version, src.Commit)
				}
			}
		}
		if !bytes.Equal(binaries[0], binaries[1]) {
			t.Errorf("%s: healerctl and kubectl-healer are not the same binary", p)
		}
		if !bytes.Equal(binaries[0], mustRead(t, filepath.Join(work, p.OS+"_"+p.Arch, "healerctl"))) {
			t.Errorf("%s: the archives' binary is not the healerctl built for them", p)
		}
	}
}

// checkKrew: the manifest is a krew Plugin whose platforms select each os/arch and name the
// kubectl-healer archive below the base URL, with that archive's SHA-256.
func checkKrew(t *testing.T, dir string, src Source, baseURL string) {
	var plugin krewPlugin
	if err := yaml.Unmarshal(mustRead(t, filepath.Join(dir, "plugin.yaml")), &plugin); err != nil {
		t.Fatalf("plugin.yaml: %v", err)
	}
	if plugin.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || plugin.Kind != "Plugin" || plugin.Metadata.Name != "healer" || plugin.Spec.Version != src.Version {
		t.Errorf("plugin.yaml: %s %s %q version %q; want krew.googlecontainertools.github.com/v1alpha2 Plugin \"healer\" %s",
			plugin.APIVersion, plugin.Kind, plugin.Metadata.Name, plugin.Spec.Version, src.Version)
	}
	if len(plugin.Spec.Platforms) != len(Platforms) {
		t.Fatalf("plugin.yaml has %d platforms, want %d", len(plugin.Spec.Platforms), len(Platforms))
	}
	for i, p := range Platforms {
		got := plugin.Spec.Platforms[i]
		archive := ArchiveName("kubectl-healer", src.Version, p)
		if got.Selector.MatchLabels["os"] != p.OS || got.Selector.MatchLabels["arch"] != p.Arch {
			t.Errorf("platform %d selects %v, want os %s arch %s", i, got.Selector.MatchLabels, p.OS, p.Arch)
		}
		if got.URI != baseURL+"/"+archive {
			t.Errorf("platform %s: uri %s, want %s/%s", p, got.URI, baseURL, archive)
		}
		sum, err := fileSHA256(filepath.Join(dir, path.Base(got.URI)))
		if err != nil {
			t.Fatalf("platform %s: the archive its uri names: %v", p, err)
		}
		if got.SHA256 != sum {
			t.Errorf("platform %s: sha256 %s, but %s has %s", p, got.SHA256, archive, sum)
		}
		if got.Bin != "kubectl-healer" {
			t.Errorf("platform %s: bin %q, want kubectl-healer", p, got.Bin)
		}
	}
}

// checkSBOMs: each SBOM is CycloneDX JSON describing its binary (its SHA-256) and lists every
// module the binary's build information records, google.golang.org/grpc at go.mod's version.
func checkSBOMs(ctx context.Context, t *testing.T, root, dir, work, images string, src Source) {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Version}}", "google.golang.org/grpc")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m google.golang.org/grpc: %v", err)
	}
	grpc := strings.TrimSpace(string(out))
	for _, p := range Platforms {
		bins := map[string][]byte{"healerctl": mustRead(t, filepath.Join(work, p.OS+"_"+p.Arch, "healerctl"))}
		for _, b := range ImageBinaries {
			bins[b] = mustRead(t, filepath.Join(images, "bin", p.OS+"_"+p.Arch, b))
		}
		for name, bin := range bins {
			file := filepath.Join(dir, "sbom", sbomName(name, src.Version, p))
			var bom cdx.BOM
			if err := cdx.NewBOMDecoder(bytes.NewReader(mustRead(t, file)), cdx.BOMFileFormatJSON).Decode(&bom); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if bom.BOMFormat != "CycloneDX" || bom.SpecVersion != SBOMSpec || bom.Metadata == nil || bom.Metadata.Component == nil || bom.Components == nil {
				t.Fatalf("%s: format %q spec %s, metadata %v: not a CycloneDX %s SBOM of a binary", file, bom.BOMFormat, bom.SpecVersion, bom.Metadata, SBOMSpec)
			}
			c := bom.Metadata.Component
			if sum := sha256Of(bin); c.Name != name || c.Hashes == nil || (*c.Hashes)[0].Value != sum {
				t.Errorf("%s: describes %q with hashes %v, want %s with sha256 %s", file, c.Name, c.Hashes, name, sum)
			}
			listed := map[string]string{}
			for _, comp := range *bom.Components {
				listed[comp.Name] = comp.Version
			}
			info, err := buildinfo.Read(bytes.NewReader(bin))
			if err != nil {
				t.Fatal(err)
			}
			for _, dep := range info.Deps {
				if dep.Replace != nil {
					dep = dep.Replace
				}
				if listed[dep.Path] != dep.Version {
					t.Errorf("%s: module %s listed at %q, the binary has %s", file, dep.Path, listed[dep.Path], dep.Version)
				}
			}
			if len(*bom.Components) != len(info.Deps)+1 {
				t.Errorf("%s: %d components, want the %d modules and the standard library", file, len(*bom.Components), len(info.Deps))
			}
			if listed["google.golang.org/grpc"] != grpc {
				t.Errorf("%s: google.golang.org/grpc at %q, go.mod requires %s", file, listed["google.golang.org/grpc"], grpc)
			}
			if listed["stdlib"] != info.GoVersion {
				t.Errorf("%s: stdlib at %q, the binary was built by %s", file, listed["stdlib"], info.GoVersion)
			}
		}
	}
}

func sha256Of(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// checkCharts: each chart package holds the chart at the VERSION file's version, dated at the
// source's time.
func checkCharts(t *testing.T, dir string, src Source) {
	for _, chart := range Charts {
		pkg := filepath.Join(dir, "charts", chart+"-"+strings.TrimPrefix(src.Version, "v")+".tgz")
		headers, data := readArchive(t, pkg)
		for _, h := range headers {
			if !h.ModTime.Equal(src.Time) {
				t.Errorf("%s: %s dated %s, want %s", pkg, h.Name, h.ModTime, src.Time)
			}
		}
		var meta struct{ Name, Version, AppVersion string }
		if err := yaml.Unmarshal(data[chart+"/Chart.yaml"], &meta); err != nil {
			t.Fatalf("%s: Chart.yaml: %v", pkg, err)
		}
		if meta.Name != chart || meta.Version != strings.TrimPrefix(src.Version, "v") || meta.AppVersion != src.Version {
			t.Errorf("%s: chart %q version %q appVersion %q, want %s %s %s", pkg, meta.Name, meta.Version, meta.AppVersion, chart, strings.TrimPrefix(src.Version, "v"), src.Version)
		}
		if _, ok := data[chart+"/values.yaml"]; !ok {
			t.Errorf("%s holds no values.yaml", pkg)
		}
	}
}

// kinds lists "Kind/name" of each object of a multi-document YAML.
func kinds(t *testing.T, file string) []string {
	var out []string
	for _, doc := range strings.Split(string(mustRead(t, file)), "\n---\n") {
		var obj struct {
			Kind     string
			Metadata struct{ Name string }
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if obj.Kind != "" {
			out = append(out, obj.Kind+"/"+obj.Metadata.Name)
		}
	}
	return out
}

// checkBundle: the rendered install holds the controller, with or without the Prometheus
// operator's objects and the remediation's settings as named.
func checkBundle(t *testing.T, dir string, src Source) {
	base := kinds(t, filepath.Join(dir, "kustomize", "volume-healer.yaml"))
	for _, want := range []string{"Namespace/volume-healer", "Deployment/volume-healer", "ServiceMonitor/volume-healer", "PrometheusRule/volume-healer"} {
		if !slices.Contains(base, want) {
			t.Errorf("kustomize/volume-healer.yaml lacks %s: %v", want, base)
		}
	}
	without := kinds(t, filepath.Join(dir, "kustomize", "volume-healer-without-prometheus-operator.yaml"))
	if !slices.Contains(without, "Deployment/volume-healer") {
		t.Errorf("volume-healer-without-prometheus-operator.yaml lacks the controller: %v", without)
	}
	for _, k := range without {
		if strings.HasPrefix(k, "ServiceMonitor/") || strings.HasPrefix(k, "PrometheusRule/") {
			t.Errorf("volume-healer-without-prometheus-operator.yaml holds %s", k)
		}
	}
	if !bytes.Contains(mustRead(t, filepath.Join(dir, "kustomize", "volume-healer-remediation.yaml")), []byte("VOLUME_HEALER_REMEDIATION_ENABLED")) {
		t.Error("volume-healer-remediation.yaml does not turn remediation on")
	}
	_, files := readArchive(t, filepath.Join(dir, "kustomize", "healer-sidecar-component-"+src.Version+".tar.gz"))
	if _, ok := files["healer-sidecar-component/kustomization.yaml"]; !ok {
		t.Errorf("the sidecar component's archive holds no kustomization.yaml: %v", slices.Sorted(maps.Keys(files)))
	}
}

// checkImages: the release's images are hack/images' tarballs with its digests.
func checkImages(t *testing.T, dir, images string) {
	var built, released []struct {
		Name, Digest, Tarball string
	}
	if err := json.Unmarshal(mustRead(t, filepath.Join(images, "images.json")), &built); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(mustRead(t, filepath.Join(dir, "images", "images.json")), &released); err != nil {
		t.Fatal(err)
	}
	if len(built) != len(released) || len(built) == 0 {
		t.Fatalf("images.json: %d images released, hack/images built %d", len(released), len(built))
	}
	for i, b := range built {
		r := released[i]
		if r.Name != b.Name || r.Digest != b.Digest || r.Tarball != b.Name+".tar" {
			t.Errorf("image %d: released %+v, built %+v", i, r, b)
		}
		if !bytes.Equal(mustRead(t, filepath.Join(dir, "images", r.Tarball)), mustRead(t, b.Tarball)) {
			t.Errorf("images/%s differs from hack/images' %s", r.Tarball, b.Tarball)
		}
	}
	if !bytes.Equal(mustRead(t, filepath.Join(dir, "images", "digests.env")), mustRead(t, filepath.Join(images, "digests.env"))) {
		t.Error("images/digests.env differs from hack/images'")
	}
}
