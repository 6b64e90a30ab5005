// Command release builds every artifact of a volume-healer release into one folder, and pushes
// nothing anywhere:
//
//	go run ./hack/release [--out dist] [--images .cache/images] [--base-url URL]
//
// (`make release` runs it.) Below --out it writes:
//
//	images/<image>.tar                      each image as `make images` builds it (hack/images, into
//	                                        --images): an OCI layout as one tar file, both platforms
//	images/images.json, images/digests.env  each image's reference and digests (hack/images' own)
//	charts/<chart>-<version>.tgz            each Helm chart of deploy/helm, packaged by helm package,
//	                                        linted (helm lint --strict) and rendered (helm template)
//	kustomize/volume-healer.yaml            deploy/base rendered by kustomize: the controller's install
//	kustomize/volume-healer-<component>.yaml deploy/base with one component of deploy/components
//	kustomize/healer-sidecar-component-<version>.tar.gz
//	                                        deploy/sidecar, the component that adds the healer sidecar
//	                                        to a driver's DaemonSet, which renders only inside the
//	                                        driver's own kustomization
//	healerctl-<version>-linux-<arch>.tar.gz      healerctl and LICENSE, for amd64 and arm64
//	kubectl-healer-<version>-linux-<arch>.tar.gz the same binary as kubectl-healer: the kubectl plugin
//	plugin.yaml                             the krew manifest of the plugin "healer": one platform per
//	                                        kubectl-healer archive, its URL below --base-url
//	                                        (RELEASE_BASE_URL) and its SHA-256
//	sbom/<binary>-<version>-linux-<arch>.cdx.json
//	                                        a CycloneDX 1.6 SBOM of each binary released (healerctl and
//	                                        the images' binaries), from the Go build information
//	                                        recorded in the binary (debug/buildinfo)
//	SHA256SUMS                              the SHA-256 of every other file, for `sha256sum -c`
//
// The output is reproducible: two runs from the same commit, with the same Go version and tools,
// write the same bytes. The binaries are built as hack/images builds the images' (CGO off,
// -trimpath, -buildvcs=false, the VERSION file's version and the commit stamped with -ldflags, no
// build setting taken from the environment); every time in an archive or SBOM is the commit's time
// (or SOURCE_DATE_EPOCH when set), owners are root, modes and order fixed.
//
// helm and kustomize are the ones hack/tools.sh builds, or those HELM and KUSTOMIZE name. The out
// folder is replaced as a whole once every artifact is built; a folder that holds something other
// than a release (no SHA256SUMS) is refused.
//
// Files: main.go (the run, its steps and the source it stamps), archive.go (reproducible tar.gz
// archives, and helm's packages made so), sbom.go (the SBOMs), krew.go (the plugin manifest).
//
// Like hack/images it builds the programs with the go command and imports none of the product;
// of the module it imports only hack/filelock, the lock of the binaries' folder.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/volume-healer/volume-healer/hack/buildsource"

	"github.com/volume-healer/volume-healer/hack/filelock"
)

// module is the Go module path, which the released binaries' build information names.
const module = buildsource.Module

// Homepage is the project's home, written into the krew manifest and the SBOMs.
const Homepage = "https://github.com/volume-healer/volume-healer"

// DefaultBaseURL is where the archives are downloaded from when --base-url and RELEASE_BASE_URL
// are not given; %s is the version (such as v0.1.0).
const DefaultBaseURL = Homepage + "/releases/download/%s"

// SumsFile holds the SHA-256 of every other file of a release.
const SumsFile = "SHA256SUMS"

// Platform is an operating system and architecture to build for.
type Platform struct{ OS, Arch string }

func (p Platform) String() string { return p.OS + "/" + p.Arch }

// Platforms are the platforms of the archives: those of the images (hack/images).
var Platforms = []Platform{{"linux", "amd64"}, {"linux", "arm64"}}

// Charts are the Helm charts released, below deploy/helm.
var Charts = []string{"volume-healer", "healer-refdriver"}

// Components are the components of deploy/components rendered with deploy/base, each into
// kustomize/volume-healer-<component>.yaml.
var Components = []string{"remediation", "without-prometheus-operator"}

// ImageBinaries are the binaries that hack/images builds into <images>/bin/<os>_<arch>/, one SBOM each.
var ImageBinaries = []string{"volume-healer", "healer-sidecar", "refdriver"}

// Source is what the build is made from and stamped with (hack/buildsource, shared with
// the other release tool).
type Source = buildsource.Source

// Options say what Run builds where.
type Options struct {
	// Root is the repository's root folder. Required.
	Root string
	// Out is the release folder, replaced as a whole. Required.
	Out string
	// Images is the folder hack/images builds the images into (make images: .cache/images).
	// Required.
	Images string
	// Work holds the binaries built for the archives, kept between runs so that the go command
	// links only what changed. Required.
	Work string
	// Helm and Kustomize are the tools' paths. Required.
	Helm, Kustomize string
	// BaseURL is the URL the archives are published below, for the krew manifest. Required.
	BaseURL string
	// Source is what to stamp and date. Required.
	Source Source
	// Log receives progress lines. Default: nothing.
	Log io.Writer
}

// Run builds the release into o.Out.
func Run(ctx context.Context, o Options) error {
	if o.Log == nil {
		o.Log = io.Discard
	}
	for name, v := range map[string]string{"root": o.Root, "out": o.Out, "images": o.Images, "work": o.Work, "helm": o.Helm, "kustomize": o.Kustomize, "base URL": o.BaseURL} {
		if v == "" {
			return fmt.Errorf("release: no %s given", name)
		}
	}
	if err := checkReplaceable(o.Out); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(o.Out), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(o.Out), "."+filepath.Base(o.Out)+".tmp-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	license, err := os.ReadFile(filepath.Join(o.Root, "LICENSE"))
	if err != nil {
		return fmt.Errorf("release: the archives carry the license: %w", err)
	}
	steps := []struct {
		name string
		run  func() error
	}{
		{"images", func() error { return images(ctx, o, tmp) }},
		{"charts", func() error { return charts(ctx, o, tmp) }},
		{"kustomize bundle", func() error { return bundle(ctx, o, tmp) }},
		{"archives, krew manifest and SBOMs", func() error { return archives(ctx, o, tmp, license) }},
		{"checksums", func() error { return writeSums(tmp) }},
	}
	for _, s := range steps {
		start := time.Now()
		if err := s.run(); err != nil {
			return fmt.Errorf("release: %s: %w", s.name, err)
		}
		fmt.Fprintf(o.Log, "release: %s in %s\n", s.name, time.Since(start).Round(100*time.Millisecond))
	}
	// hack/images read the source itself: a commit or an edit during the run would leave images
	// and archives of two sources.
	now, err := buildsource.Read(ctx, o.Root, strconv.FormatInt(o.Source.Time.Unix(), 10))
	if err != nil {
		return err
	}
	if now.Version != o.Source.Version || now.Commit != o.Source.Commit {
		return fmt.Errorf("release: the source changed during the run, from %s at %s to %s at %s: run it again", o.Source.Version, o.Source.Commit, now.Version, now.Commit)
	}
	if err := os.RemoveAll(o.Out); err != nil {
		return err
	}
	return os.Rename(tmp, o.Out)
}

// checkReplaceable refuses an out folder that holds files but is not a release.
func checkReplaceable(out string) error {
	entries, err := os.ReadDir(out)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && len(entries) == 0) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(out, SumsFile)); err != nil {
		return fmt.Errorf("release: %s holds files but no %s, so it is no release folder: refusing to replace it", out, SumsFile)
	}
	return nil
}

// images runs hack/images as `make images` does, into o.Images, and copies what it built.
func images(ctx context.Context, o Options, out string) error {
	cmd := exec.CommandContext(ctx, "go", "run", "./hack/images", "--out", o.Images)
	cmd.Dir = o.Root
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.FormatInt(o.Source.Time.Unix(), 10))
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go run ./hack/images: %w\n%s", err, log.String())
	}
	raw, err := os.ReadFile(filepath.Join(o.Images, "images.json"))
	if err != nil {
		return err
	}
	// hack/images' entry, of which the release keeps all but the local paths.
	var built []struct {
		Name      string            `json:"name"`
		Ref       string            `json:"ref"`
		Binary    string            `json:"binary"`
		Digest    string            `json:"digest"`
		Platforms map[string]string `json:"platforms"`
		Tarball   string            `json:"tarball"`
	}
	if err := json.Unmarshal(raw, &built); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(o.Images, "images.json"), err)
	}
	dir := filepath.Join(out, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i, b := range built {
		name := b.Name + ".tar"
		if err := copyFile(b.Tarball, filepath.Join(dir, name)); err != nil {
			return err
		}
		built[i].Tarball = name
		fmt.Fprintf(o.Log, "release: image %s@%s\n", b.Ref, b.Digest)
	}
	data, err := json.MarshalIndent(built, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "images.json"), append(data, '\n'), 0o644); err != nil {
		return err
	}
	return copyFile(filepath.Join(o.Images, "digests.env"), filepath.Join(dir, "digests.env"))
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	f, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, in); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// tool runs a tool in dir and returns its standard output; a failure carries its standard error.
func tool(ctx context.Context, dir, path string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w\n%s%s", filepath.Base(path), strings.Join(args, " "), err, out, stderr.String())
	}
	return out, nil
}

// charts packages each chart with helm package, makes the package reproducible, and checks the
// package: helm lint --strict, and helm template with its default values.
func charts(ctx context.Context, o Options, out string) error {
	dir := filepath.Join(out, "charts")
	scratch := filepath.Join(out, ".helm")
	for _, d := range []string{dir, scratch} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	defer func() { _ = os.RemoveAll(scratch) }()
	for _, chart := range Charts {
		src := filepath.Join(o.Root, "deploy", "helm", chart)
		if _, err := tool(ctx, o.Root, o.Helm, "package", src, "--destination", scratch); err != nil {
			return err
		}
		pkgs, err := filepath.Glob(filepath.Join(scratch, chart+"-*.tgz"))
		if err != nil || len(pkgs) != 1 {
			return fmt.Errorf("chart %s: helm package left %d packages named %s-*.tgz in %s", chart, len(pkgs), chart, scratch)
		}
		pkg := filepath.Join(dir, filepath.Base(pkgs[0]))
		if err := NormalizeChart(pkgs[0], pkg, o.Source.Time); err != nil {
			return fmt.Errorf("chart %s: %w", chart, err)
		}
		if err := os.Remove(pkgs[0]); err != nil {
			return err
		}
		if _, err := tool(ctx, o.Root, o.Helm, "lint", "--strict", pkg); err != nil {
			return fmt.Errorf("chart %s: %w", chart, err)
		}
		if _, err := tool(ctx, o.Root, o.Helm, "template", chart, pkg, "--namespace", chart); err != nil {
			return fmt.Errorf("chart %s: %w", chart, err)
		}
		fmt.Fprintf(o.Log, "release: chart %s (linted, rendered)\n", filepath.Base(pkg))
	}
	return nil
}

// bundle renders deploy/base alone and with each component, and archives the sidecar component.
func bundle(ctx context.Context, o Options, out string) error {
	dir := filepath.Join(out, "kustomize")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	base := filepath.Join(o.Root, "deploy", "base")
	yaml, err := tool(ctx, o.Root, o.Kustomize, "build", base)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "volume-healer.yaml"), yaml, 0o644); err != nil {
		return err
	}
	for _, c := range Components {
		// A kustomization of the base and the component, in a folder of its own: kustomize takes
		// only relative paths.
		k, err := os.MkdirTemp("", "release-kustomize-")
		if err != nil {
			return err
		}
		relBase, err1 := filepath.Rel(k, base)
		relComp, err2 := filepath.Rel(k, filepath.Join(o.Root, "deploy", "components", c))
		if err := errors.Join(err1, err2); err != nil {
			_ = os.RemoveAll(k)
			return err
		}
		kustomization := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\ncomponents:\n  - %s\n", relBase, relComp)
		err = os.WriteFile(filepath.Join(k, "kustomization.yaml"), []byte(kustomization), 0o644)
		if err == nil {
			yaml, err = tool(ctx, k, o.Kustomize, "build", ".")
		}
		_ = os.RemoveAll(k)
		if err != nil {
			return fmt.Errorf("deploy/base with component %s: %w", c, err)
		}
		if err := os.WriteFile(filepath.Join(dir, "volume-healer-"+c+".yaml"), yaml, 0o644); err != nil {
			return err
		}
	}
	files, err := FolderFiles(filepath.Join(o.Root, "deploy", "sidecar"), "healer-sidecar-component")
	if err != nil {
		return err
	}
	return WriteArchive(filepath.Join(dir, "healer-sidecar-component-"+o.Source.Version+".tar.gz"), files, o.Source.Time)
}

// buildEnv is env with every variable that changes what go build produces set for p, as
// hack/images sets them: a static binary for the platform's baseline CPU, no experiments, no
// flags from the caller.
func buildEnv(env []string, p Platform) []string {
	set := map[string]string{
		"CGO_ENABLED": "0", "GOOS": p.OS, "GOARCH": p.Arch, "GOFLAGS": "", "GOEXPERIMENT": "",
		"GOAMD64": "v1", "GOARM64": "v8.0", "GO386": "", "GOARM": "", "GOMIPS": "", "GOMIPS64": "", "GOPPC64": "", "GORISCV64": "", "GOWASM": "",
	}
	out := slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		_, ok := set[k]
		return ok
	})
	for k, v := range set {
		if v != "" {
			out = append(out, k+"="+v)
		}
	}
	slices.Sort(out)
	return out
}

// buildHealerctl builds healerctl for p into dir and returns its path.
func buildHealerctl(ctx context.Context, o Options, p Platform) (string, error) {
	dir := filepath.Join(o.Work, p.OS+"_"+p.Arch)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", o.Source.LDFlags(),
		"-o", dir+string(filepath.Separator), "./cmd/healerctl")
	cmd.Dir = o.Root
	cmd.Env = buildEnv(os.Environ(), p)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/healerctl for %s: %w\n%s", p, err, log.String())
	}
	return filepath.Join(dir, "healerctl"), nil
}

// ArchiveName is the name of a binary's archive.
func ArchiveName(binary, version string, p Platform) string {
	return fmt.Sprintf("%s-%s-%s-%s.tar.gz", binary, version, p.OS, p.Arch)
}

// archives builds healerctl for each platform, writes its two archives, the krew manifest, and
// the SBOM of each binary released.
func archives(ctx context.Context, o Options, out string, license []byte) error {
	unlock, err := lockWork(o.Work)
	if err != nil {
		return err
	}
	defer unlock()
	sboms := filepath.Join(out, "sbom")
	if err := os.MkdirAll(sboms, 0o755); err != nil {
		return err
	}
	var plugin []KrewPlatform
	for _, p := range Platforms {
		bin, err := buildHealerctl(ctx, o, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			return err
		}
		for _, name := range []string{"healerctl", "kubectl-healer"} {
			archive := ArchiveName(name, o.Source.Version, p)
			files := []File{{Name: name, Mode: 0o755, Data: data}, {Name: "LICENSE", Mode: 0o644, Data: license}}
			if err := WriteArchive(filepath.Join(out, archive), files, o.Source.Time); err != nil {
				return err
			}
			if name == "kubectl-healer" {
				sum, err := fileSHA256(filepath.Join(out, archive))
				if err != nil {
					return err
				}
				plugin = append(plugin, KrewPlatform{Platform: p, URI: strings.TrimSuffix(o.BaseURL, "/") + "/" + archive, SHA256: sum, Bin: name})
			}
		}
		if err := writeSBOM(filepath.Join(sboms, sbomName("healerctl", o.Source.Version, p)), bin, "healerctl", o.Source); err != nil {
			return err
		}
		for _, b := range ImageBinaries {
			path := filepath.Join(o.Images, "bin", p.OS+"_"+p.Arch, b)
			if err := writeSBOM(filepath.Join(sboms, sbomName(b, o.Source.Version, p)), path, b, o.Source); err != nil {
				return err
			}
		}
	}
	manifest, err := KrewManifest(o.Source.Version, plugin)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "plugin.yaml"), manifest, 0o644)
}

func sbomName(binary, version string, p Platform) string {
	return fmt.Sprintf("%s-%s-%s-%s.cdx.json", binary, version, p.OS, p.Arch)
}

// lockWork takes the lock of the binaries' folder, so that two runs do not build into it at once.
func lockWork(work string) (func(), error) {
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	return filelock.Lock(filepath.Join(work, ".lock"))
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeSums writes SHA256SUMS: "<sha256>  <path>" for every file below out, sorted by path, as
// sha256sum writes and checks them.
func writeSums(out string) error {
	var paths []string
	err := filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(out, p)
		if err != nil {
			return err
		}
		paths = append(paths, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return err
	}
	slices.Sort(paths)
	var b strings.Builder
	for _, p := range paths {
		sum, err := fileSHA256(filepath.Join(out, filepath.FromSlash(p)))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, p)
	}
	return os.WriteFile(filepath.Join(out, SumsFile), []byte(b.String()), 0o644)
}

// toolPath is the path of a tool: the value of env when set, else what hack/tools.sh prints.
func toolPath(ctx context.Context, root, name, env string) (string, error) {
	if p := os.Getenv(env); p != "" {
		return p, nil
	}
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "hack", "tools.sh"), name)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/tools.sh %s: %w", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

func main() {
	out := flag.String("out", "dist", "the release `folder`, replaced as a whole")
	imgs := flag.String("images", ".cache/images", "the `folder` hack/images builds the images into, as make images does")
	work := flag.String("work", ".cache/release", "the `folder` for the archives' binaries, kept between runs")
	baseURL := flag.String("base-url", os.Getenv("RELEASE_BASE_URL"), "the `URL` the archives are published below, for the krew manifest (default "+fmt.Sprintf(DefaultBaseURL, "<version>")+")")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *out, *imgs, *work, *baseURL); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out, imgs, work, baseURL string) error {
	start := time.Now()
	root, err := buildsource.Git(ctx, ".", "rev-parse", "--show-toplevel")
	if err != nil {
		return err
	}
	src, err := buildsource.Read(ctx, root, os.Getenv("SOURCE_DATE_EPOCH"))
	if err != nil {
		return err
	}
	if baseURL == "" {
		baseURL = fmt.Sprintf(DefaultBaseURL, src.Version)
	}
	abs := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(root, p)
	}
	helm, err := toolPath(ctx, root, "helm", "HELM")
	if err != nil {
		return err
	}
	kustomize, err := toolPath(ctx, root, "kustomize", "KUSTOMIZE")
	if err != nil {
		return err
	}
	fmt.Printf("release %s at commit %s, dated %s\n", src.Version, src.Commit, src.Time.Format(time.RFC3339))
	o := Options{Root: root, Out: abs(out), Images: abs(imgs), Work: abs(work), Helm: helm, Kustomize: kustomize,
		BaseURL: baseURL, Source: src, Log: os.Stdout}
	if err := Run(ctx, o); err != nil {
		return err
	}
	fmt.Printf("wrote the %s release to %s in %s (nothing pushed); check it with: (cd %s && sha256sum -c %s)\n",
		src.Version, o.Out, time.Since(start).Round(100*time.Millisecond), out, SumsFile)
	return nil
}
