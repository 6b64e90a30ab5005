package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/hack/buildsource"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// repoRoot is the repository's root: two folders up from this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod two folders up from hack/images: %v", err)
	}
	return root
}

// TestImages builds every image for both platforms the way `make images` does, twice, and checks
// what a user of the images relies on: the same source gives the same digests; each image
// runs its binary, built for its platform, static, as user 65532, with the labels naming the
// commit; the tarball holds the same images as the layout; and, where the machine can run
// containers, each image of the machine's platform prints the commit for --version and its
// usage for --help in a container.
func TestImages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary for two platforms")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Minute)
	defer cancel()
	root := repoRoot(t)
	src, err := buildsource.Read(ctx, root, "")
	if err != nil {
		t.Fatal(err)
	}
	head, err := buildsource.Git(ctx, root, "rev-parse", "HEAD")
	if err != nil {
		t.Fatal(err)
	}
	if src.Commit != head && src.Commit != head+"-dirty" {
		t.Fatalf("the images would be stamped with commit %q, but HEAD is %s", src.Commit, head)
	}

	// The binaries go where make images puts them, so that the suites of one run, and make images
	// after it, link each binary once.
	bins := filepath.Join(root, ".cache", "images", "bin")
	first := t.TempDir()
	start := time.Now()
	built, err := Run(ctx, Options{Root: root, Out: first, Binaries: bins, Source: src, Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first build: %s", time.Since(start).Round(time.Second))

	t.Run("digests.env", func(t *testing.T) {
		env, err := os.ReadFile(filepath.Join(first, "digests.env"))
		if err != nil {
			t.Fatal(err)
		}
		want := "VERSION=" + src.Version + "\nVOLUME_HEALER_DIGEST=" + built[0].Digest + "\nHEALER_SIDECAR_DIGEST=" + built[1].Digest +
			"\nHEALER_REFDRIVER_DIGEST=" + built[2].Digest + "\n"
		if string(env) != want {
			t.Errorf("digests.env:\n%s\nwant:\n%s", env, want)
		}
	})

	t.Run("a second build gives the same digests and files", func(t *testing.T) {
		second := t.TempDir()
		again, err := Run(ctx, Options{Root: root, Out: second, Binaries: bins, Source: src, Log: testLog{t}})
		if err != nil {
			t.Fatal(err)
		}
		for i, b := range built {
			a := again[i]
			if a.Digest != b.Digest || !maps(a.Platforms, b.Platforms) {
				t.Errorf("%s: built twice from the same source: %s %v, then %s %v", b.Name, b.Digest, b.Platforms, a.Digest, a.Platforms)
			}
			if x, y := fileHash(t, b.Tarball), fileHash(t, a.Tarball); x != y {
				t.Errorf("%s: the tarballs of two builds differ: %s and %s", b.Name, x, y)
			}
		}
	})

	t.Run("a binary compiled from scratch is the same", func(t *testing.T) {
		// Every other build of the run takes compiled packages from the go command's cache; this
		// one recompiles the reference driver and everything it imports, the standard library
		// included (-a), for the platform that is not this machine's: its bytes must be those of
		// the binary in the images.
		p := Platform{"linux", "arm64"}
		if runtime.GOARCH == "arm64" {
			p = Platform{"linux", "amd64"}
		}
		img := Images[slices.IndexFunc(Images, func(i Image) bool { return i.Name == "healer-refdriver" })]
		dir := t.TempDir()
		start := time.Now()
		if err := BuildBinaries(ctx, root, dir, src, p, []Image{img}, "-a"); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s for %s compiled from scratch in %s", img.Binary, p, time.Since(start).Round(time.Second))
		if x, y := fileHash(t, filepath.Join(dir, img.Binary)), fileHash(t, BinaryPath(bins, p, img)); x != y {
			t.Errorf("%s for %s: compiled from scratch %s, from the build cache %s", img.Binary, p, x, y)
		}
	})

	for _, b := range built {
		t.Run("inspect "+b.Name, func(t *testing.T) {
			img := Images[slices.IndexFunc(Images, func(i Image) bool { return i.Name == b.Name })]
			idx := layoutIndex(t, b.Layout, b.Ref)
			checkIndex(t, idx, b, img, src, bins)
			// The tarball is the layout in one file: unpacked, it holds the same index.
			unpacked := t.TempDir()
			untar(t, b.Tarball, unpacked)
			if d := digestOf(t, layoutIndex(t, unpacked, b.Ref)); d != b.Digest {
				t.Errorf("%s: the tarball's index is %s, the layout's %s", b.Tarball, d, b.Digest)
			}
		})
	}

	t.Run("run in a container", func(t *testing.T) {
		runContainers(t, root, built, src)
	})
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func maps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func fileHash(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("sha256:%x", h.Sum(nil))
}

func digestOf(t *testing.T, idx v1.ImageIndex) string {
	t.Helper()
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// layoutIndex returns the image index that the layout in dir names ref.
func layoutIndex(t *testing.T, dir, ref string) v1.ImageIndex {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatalf("OCI layout %s: %v", dir, err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Annotations[refNameAnnotation] != ref {
		t.Fatalf("OCI layout %s: index.json lists %+v, want one image index named %s", dir, m.Manifests, ref)
	}
	idx, err := top.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		t.Fatalf("OCI layout %s: %v", dir, err)
	}
	return idx
}

// elfMachines are the ELF machine of each architecture built.
var elfMachines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

func checkIndex(t *testing.T, idx v1.ImageIndex, b Built, img Image, src Source, bins string) {
	t.Helper()
	if d := digestOf(t, idx); d != b.Digest {
		t.Errorf("index digest %s, images.json says %s", d, b.Digest)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, desc := range m.Manifests {
		p := Platform{desc.Platform.OS, desc.Platform.Architecture}
		platforms = append(platforms, p.String())
		im, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkImage(t, im, p, img, src, BinaryPath(bins, p, img))
	}
	if want := []string{"linux/amd64", "linux/arm64"}; !slices.Equal(platforms, want) {
		t.Errorf("platforms %v, want %v", platforms, want)
	}
}

func checkImage(t *testing.T, im v1.Image, p Platform, img Image, src Source, binaryPath string) {
	t.Helper()
	cf, err := im.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if cf.OS != p.OS || cf.Architecture != p.Arch {
		t.Errorf("%s: configuration says %s/%s", p, cf.OS, cf.Architecture)
	}
	if want := []string{"/" + img.Binary}; !slices.Equal(c.Entrypoint, want) {
		t.Errorf("%s: entrypoint %q, want %q", p, c.Entrypoint, want)
	}
	if c.User != "65532:65532" {
		t.Errorf("%s: user %q, want 65532:65532", p, c.User)
	}
	for key, want := range map[string]string{
		LabelSource:   "https://github.com/volume-healer/volume-healer",
		LabelRevision: src.Commit,
		LabelVersion:  src.Version,
	} {
		if got := c.Labels[key]; got != want {
			t.Errorf("%s: label %s = %q, want %q", p, key, got, want)
		}
	}
	files := imageFiles(t, im)
	want, err := os.ReadFile(binaryPath)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := files[img.Binary]
	switch {
	case !ok:
		t.Fatalf("%s: no /%s in the image; it holds %v", p, img.Binary, names(files))
	case !bytes.Equal(got, want):
		t.Errorf("%s: /%s is not the binary built at %s", p, img.Binary, binaryPath)
	}
	f, err := elf.NewFile(bytes.NewReader(got))
	if err != nil {
		t.Fatalf("%s: /%s: %v", p, img.Binary, err)
	}
	if f.Machine != elfMachines[p.Arch] {
		t.Errorf("%s: /%s is built for %s", p, img.Binary, f.Machine)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP || prog.Type == elf.PT_DYNAMIC {
			t.Errorf("%s: /%s is dynamically linked (%s): it cannot run in an image without a C library", p, img.Binary, prog.Type)
		}
	}
	if !strings.Contains(string(files["etc/passwd"]), ":65532:65532:") {
		t.Errorf("%s: /etc/passwd names no user 65532: %q", p, files["etc/passwd"])
	}
}

// imageFiles returns the regular files of the image's layers by path.
func imageFiles(t *testing.T, im v1.Image) map[string][]byte {
	t.Helper()
	layers, err := im.Layers()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Typeflag != tar.TypeReg {
				continue
			}
			if h.Uid != 0 || h.Gid != 0 {
				t.Errorf("/%s is owned by %d:%d, want root", h.Name, h.Uid, h.Gid)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			out[h.Name] = data
		}
		_ = rc.Close()
	}
	return out
}

func names(files map[string][]byte) []string {
	var out []string
	for n := range files {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func untar(t *testing.T, file, dir string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			t.Fatalf("%s: entry %q leaves the archive's folder", file, h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("%s: entry %q of type %c", file, h.Name, h.Typeflag)
		}
	}
}

// helpMentions is a flag that each binary's --help documents.
var helpMentions = map[string]string{
	"volume-healer":  "--config",
	"healer-sidecar": "--driver-endpoint",
	"refdriver":      "-state-dir",
}

// runContainers loads each image's tarball into a podman store of the test's own and runs the
// binary of this machine's platform with --version and --help. Where podman is missing and
// cannot be installed, the images were checked above without running them; in CI that is a
// failure.
func runContainers(t *testing.T, root string, built []Built, src Source) {
	conf, err := exec.Command(filepath.Join(root, "hack", "podman.sh")).Output()
	if err != nil {
		msg := fmt.Sprintf("hack/podman.sh: %v: %s", err, stderrOf(err))
		if os.Getenv("CI") == "true" {
			t.Fatalf("cannot run containers in CI: %s", msg)
		}
		t.Logf("Not run in a container, only inspected (this machine cannot run podman): %s", msg)
		return
	}
	// A store of the test's own: nothing is left in the machine's podman store, and nothing
	// there is taken for what this test loaded. podman leaves nothing mounted in it once its
	// containers have ended, so that the temporary folder's removal removes it.
	// podman wants a short runroot (50 characters at most), which t.TempDir's paths are not.
	store, err := os.MkdirTemp("", "images-podman-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(store) })
	podman := func(args ...string) (stdout, stderr string, err error) {
		cmd := exec.Command("podman", append([]string{
			"--root", filepath.Join(store, "root"), "--runroot", filepath.Join(store, "run"),
			"--runtime", "runc", "--cgroup-manager=cgroupfs", "--events-backend=file",
		}, args...)...)
		cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+strings.TrimSpace(string(conf)))
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			return out.String(), errOut.String(), fmt.Errorf("podman %s: %w: %s", strings.Join(args, " "), err, errOut.String())
		}
		return out.String(), errOut.String(), nil
	}
	platform := "linux/" + runtime.GOARCH
	for _, b := range built {
		t.Run(b.Name, func(t *testing.T) {
			out, _, err := podman("load", "-i", b.Tarball)
			if err != nil {
				t.Fatal(err)
			}
			ref := "localhost/" + b.Ref
			if !strings.Contains(out, ref) {
				t.Fatalf("podman load -i %s: %q, want it to load %s", b.Tarball, out, ref)
			}
			// podman picks this machine's image out of the index, and keeps the index's digest.
			inspect, _, err := podman("image", "inspect", "--format", "{{.Digest}} {{.Os}}/{{.Architecture}} {{.Config.User}}", ref)
			if err != nil {
				t.Fatal(err)
			}
			if want := b.Digest + " " + platform + " 65532:65532"; strings.TrimSpace(inspect) != want {
				t.Errorf("podman sees %s as %q, want %q", ref, strings.TrimSpace(inspect), want)
			}
			binary := strings.TrimPrefix(b.Binary, "/")
			version, _, err := podman("run", "--rm", "--network", "none", ref, "--version")
			if err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("%s %s (commit %s, %s, %s)\n", binary, src.Version, src.Commit, runtime.Version(), platform)
			if version != want {
				t.Errorf("%s --version printed %q, want %q", ref, version, want)
			} else {
				t.Logf("podman run %s --version: %s", ref, strings.TrimSpace(version))
			}
			// cobra prints the usage on stdout, Go's flag packages on stderr; both exit 0.
			stdout, stderr, err := podman("run", "--rm", "--network", "none", ref, "--help")
			if err != nil {
				t.Fatal(err)
			}
			if flag := helpMentions[binary]; !strings.Contains(stdout+stderr, flag) {
				t.Errorf("%s --help does not mention %s:\n%s%s", ref, flag, stdout, stderr)
			}
		})
	}
}

func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return strings.TrimSpace(string(ee.Stderr))
	}
	return ""
}
