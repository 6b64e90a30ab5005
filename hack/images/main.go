// Command images builds the container images of volume-healer without a container engine: the
// controller (volume-healer), the healer sidecar (healer-sidecar) and the reference driver
// (healer-refdriver), each for linux/amd64 and linux/arm64.
//
//	go run ./hack/images [--out .cache/images] [--platforms linux/amd64,linux/arm64]
//
// (`make images` runs it.) Each image holds one static Go binary (CGO off, -trimpath, the
// version of the VERSION file and the git commit stamped with -ldflags) at /<binary>, and
// /etc/passwd and /etc/group naming the user 65532 it runs as; no base image is pulled. Its
// configuration sets the entrypoint, that user, and the OCI labels source, revision, version,
// created and title. The two platforms' images form one OCI image index.
//
// The builds are reproducible: the same commit gives the same bytes and so the same digests on
// any machine with the same Go version. Every time in the images and archives is the commit's
// time (or SOURCE_DATE_EPOCH when set), file owners are root and modes fixed, and the Go build
// takes no setting from the environment (GOFLAGS, GOAMD64, ...) that would change its output.
//
// Output, below --out:
//
//	<image>/         OCI image layout whose index.json names the image index ("<image>:<version>")
//	<image>.tar      the same layout as one tar file: `podman load -i`, `docker load -i`,
//	                 `skopeo copy --all oci-archive:<image>.tar docker://...`
//	images.json      for each image: its reference, the digest of its index and of each platform's
//	                 image, and the paths of both forms
//	digests.env      the same for a shell (`. .cache/images/digests.env`): VERSION, and the
//	                 digest of each image's index as VOLUME_HEALER_DIGEST, HEALER_SIDECAR_DIGEST, ...
//	bin/<os>_<arch>/ the binaries in the images
//
// It builds only from the repository it runs in, and needs git and the go command.
//
// With --cluster-images it also builds healer-refdriver-rclone: the refdriver binary with rclone
// and fusermount from this machine's Debian packages and the libraries they load (rclone.go), so
// that a real node can run the reference driver with a FUSE mounter nobody here wrote.
//
// Files: main.go (which images, from which source, the binaries' builds, the run and its
// outputs), oci.go (an image's layer and configuration, the index, the layout and its archive),
// rclone.go (what the rclone image takes from the machine).
//
// It owns what goes into each image and the reproducibility of the bytes; the programs in them
// (cmd/, and for --cluster-images test/cluster/pause and test/workload) it builds with the go
// command rather than imports. Of the module it imports only hack/filelock, the build lock it
// shares with test/harness; it must not import test/ (nothing outside test/ does) nor the
// product's packages, whose code reaches the images only as built binaries.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/volume-healer/volume-healer/hack/buildsource"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/volume-healer/volume-healer/hack/filelock"
)

// sourceURL is the value of the label org.opencontainers.image.source.
const sourceURL = "https://github.com/volume-healer/volume-healer"

// User is the user and group the images run as: not root, and the UID that distroless images and
// the restricted Pod Security Standard's examples use for "nonroot".
const User = "65532:65532"

// OCI label (and annotation) keys the images carry.
const (
	LabelSource   = "org.opencontainers.image.source"
	LabelRevision = "org.opencontainers.image.revision"
	LabelVersion  = "org.opencontainers.image.version"
	LabelCreated  = "org.opencontainers.image.created"
	LabelTitle    = "org.opencontainers.image.title"
	LabelDesc     = "org.opencontainers.image.description"
	// refNameAnnotation names an image in an OCI layout's index.json.
	refNameAnnotation = "org.opencontainers.image.ref.name"
)

// Image is one image to build: which binary, from which package.
type Image struct {
	// Name is the image's name, without registry or tag.
	Name string
	// Package is the main package, relative to the module root.
	Package string
	// Binary is the binary's name, which is also its path (/<Binary>) in the image.
	Binary string
	// Description is the label org.opencontainers.image.description.
	Description string
	// Prebuilt, when set, is the path of a static binary built elsewhere (for the one platform
	// being built) to put in the image instead of building Package.
	Prebuilt string
	// Tag is the image's tag when it is not the project's version (a prebuilt program's own).
	Tag string
	// Files are files of this machine put into the image beside the binary: a program of the
	// distribution the binary runs, and the shared libraries it loads. Default: none.
	Files []HostFile
	// Path is the image's PATH. Default: "/", where the binary is.
	Path string
}

// HostFile is a file of the machine that builds the images, put into an image.
type HostFile struct {
	// Path is its absolute path in the image.
	Path string
	// Source is the file on this machine, symbolic links followed; "" with Link.
	Source string
	// Link, when set, makes Path a symbolic link to it instead.
	Link string
}

// Images are the images `make images` builds. deploy/ names the first two.
var Images = []Image{
	{Name: "volume-healer", Package: "./cmd/volume-healer", Binary: "volume-healer",
		Description: "volume-healer controller: probes and heals CSI volumes after node plugin restarts"},
	{Name: "healer-sidecar", Package: "./cmd/healer-sidecar", Binary: "healer-sidecar",
		Description: "volume-healer sidecar: serves the controller in a CSI node plugin pod and relays to the driver"},
	{Name: "healer-refdriver", Package: "./cmd/refdriver", Binary: "refdriver",
		Description: "volume-healer reference driver: a CSI node plugin that implements the healer protocol"},
}

// ClusterImages are the images a real node needs besides Images, for the real-cluster suite and
// the demo (`--cluster-images`): the pod sandbox's pause program and the test workload, built from
// this module, the CSI sidecars of the reference driver's controller plugin, which hack/node.sh
// builds into nodeBin, and, when csiAddons names it, the csi-addons sidecar that
// hack/csi-addons-sidecar.sh builds (each binary next to a <binary>.version stamp), and the
// reference driver with rclone (RcloneImage). They are built for the machine's own platform only.
func ClusterImages(nodeBin, csiAddons string) ([]Image, error) {
	images := []Image{
		{Name: "healer-test-pause", Package: "./test/cluster/pause", Binary: "pause",
			Description: "pod sandbox for the volume-healer real-cluster tests"},
		{Name: "healer-test-workload", Package: "./test/workload", Binary: "workload",
			Description: "writes and reads a file on its volume, one JSON line per try"},
	}
	type program struct{ name, bin, script string }
	prebuilt := []program{
		{"csi-provisioner", filepath.Join(nodeBin, "csi-provisioner"), "hack/node.sh"},
		{"csi-attacher", filepath.Join(nodeBin, "csi-attacher"), "hack/node.sh"},
	}
	if csiAddons != "" {
		prebuilt = append(prebuilt, program{"csi-addons-sidecar", csiAddons, "hack/csi-addons-sidecar.sh"})
	}
	rclone, err := RcloneImage(context.Background())
	if err != nil {
		return nil, err
	}
	images = append(images, rclone)
	for _, p := range prebuilt {
		v, err := os.ReadFile(p.bin + ".version")
		if err != nil {
			return nil, fmt.Errorf("%s: %w (%s builds it)", p.name, err, p.script)
		}
		images = append(images, Image{Name: p.name, Binary: p.name, Prebuilt: p.bin, Tag: strings.TrimSpace(string(v)),
			Description: p.name + " built from the Go module proxy by " + p.script})
	}
	return images, nil
}

// Platform is an operating system and architecture to build for.
type Platform struct{ OS, Arch string }

func (p Platform) String() string { return p.OS + "/" + p.Arch }

// DefaultPlatforms are the platforms every image is built for.
var DefaultPlatforms = []Platform{{"linux", "amd64"}, {"linux", "arm64"}}

// ParsePlatforms reads a comma-separated list of os/arch.
func ParsePlatforms(s string) ([]Platform, error) {
	var out []Platform
	for _, part := range strings.Split(s, ",") {
		goos, goarch, ok := strings.Cut(strings.TrimSpace(part), "/")
		if !ok || goos != "linux" || goarch == "" {
			return nil, fmt.Errorf("platform %q: want linux/<arch>, such as linux/amd64", part)
		}
		out = append(out, Platform{goos, goarch})
	}
	return out, nil
}

// Source is what the build is made from and stamped with (hack/buildsource, shared with
// the other release tool).
type Source = buildsource.Source

// BuildBinaries builds the binaries of images for p into dir, one go build for all of them, with
// flags added to go build's. The go command leaves a binary that is up to date as it is.
func BuildBinaries(ctx context.Context, root, dir string, src Source, p Platform, images []Image, flags ...string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags", src.LDFlags(), "-o", dir + string(filepath.Separator)}
	args = append(args, flags...)
	n := len(args)
	for _, img := range images {
		// Two images may carry one binary (healer-refdriver and healer-refdriver-rclone).
		if img.Prebuilt == "" && !slices.Contains(args[n:], img.Package) {
			args = append(args, img.Package)
		}
	}
	if len(args) == n {
		return nil
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = buildEnv(os.Environ(), p)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for %s: %w\n%s", p, err, out.String())
	}
	return nil
}

// buildEnv is env with every variable that changes what go build produces set for p: a static
// binary for the platform's baseline CPU, no experiments, no flags from the caller.
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

// Built is what was built of one image: the entry of images.json.
type Built struct {
	// Name is the image's name and Ref its name and tag.
	Name string `json:"name"`
	Ref  string `json:"ref"`
	// Binary is the path of the binary in the image.
	Binary string `json:"binary"`
	// Digest is the digest of the image index: what `crane push` of Layout gives in a registry.
	Digest string `json:"digest"`
	// Platforms maps each os/arch to the digest of its image.
	Platforms map[string]string `json:"platforms"`
	// Layout is the OCI image layout's folder, Tarball its tar file.
	Layout  string `json:"layout"`
	Tarball string `json:"tarball"`
}

// Options say what Run builds where.
type Options struct {
	// Root is the repository's root folder. Required.
	Root string
	// Out receives the layouts, tarballs and images.json. Required.
	Out string
	// Binaries is the folder the binaries are built into, as <os>_<arch>/<binary>. Builds into one
	// folder take turns (a lock file in it), and the go command leaves the binaries that are up to
	// date, so that two builds from the same source link each binary once. Default: Out/bin.
	Binaries string
	// Source is what to stamp and date. Required.
	Source Source
	// Platforms to build for. Default DefaultPlatforms.
	Platforms []Platform
	// Images to build. Default Images.
	Images []Image
	// Log receives progress lines. Default: nothing.
	Log io.Writer
}

// BinaryPath is where Run finds or puts img's binary for p below a binaries folder.
func BinaryPath(dir string, p Platform, img Image) string {
	return filepath.Join(dir, p.OS+"_"+p.Arch, img.Binary)
}

// Run builds the binaries (unless given), the images and their index, and writes each image's
// layout and tarball, then images.json.
func Run(ctx context.Context, o Options) ([]Built, error) {
	if len(o.Platforms) == 0 {
		o.Platforms = DefaultPlatforms
	}
	if len(o.Images) == 0 {
		o.Images = Images
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	bins := o.Binaries
	if bins == "" {
		bins = filepath.Join(o.Out, "bin")
	}
	if err := os.MkdirAll(bins, 0o755); err != nil {
		return nil, err
	}
	unlock, err := filelock.Lock(filepath.Join(bins, ".lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	for _, p := range o.Platforms {
		start := time.Now()
		if err := BuildBinaries(ctx, o.Root, filepath.Join(bins, p.OS+"_"+p.Arch), o.Source, p, o.Images); err != nil {
			return nil, err
		}
		fmt.Fprintf(o.Log, "built the binaries for %s in %s\n", p, time.Since(start).Round(100*time.Millisecond))
	}
	var built []Built
	for _, img := range o.Images {
		b, err := pack(o, bins, img)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Name, err)
		}
		fmt.Fprintf(o.Log, "%s@%s\n", b.Ref, b.Digest)
		built = append(built, b)
	}
	data, err := json.MarshalIndent(built, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.Out, "images.json"), append(data, '\n'), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.Out, "digests.env"), []byte(DigestsEnv(o.Source, built)), 0o644); err != nil {
		return nil, err
	}
	return built, nil
}

// DigestsEnv is digests.env: shell assignments of VERSION and of each image's index digest, the
// variable named after the image (volume-healer: VOLUME_HEALER_DIGEST).
func DigestsEnv(src Source, built []Built) string {
	var b strings.Builder
	fmt.Fprintf(&b, "VERSION=%s\n", src.Version)
	for _, img := range built {
		fmt.Fprintf(&b, "%s_DIGEST=%s\n", strings.ToUpper(strings.ReplaceAll(img.Name, "-", "_")), img.Digest)
	}
	return b.String()
}

func pack(o Options, bins string, img Image) (Built, error) {
	tag := img.Tag
	if tag == "" {
		tag = o.Source.Version
	}
	b := Built{
		Name: img.Name, Ref: img.Name + ":" + tag, Binary: "/" + img.Binary, Platforms: map[string]string{},
		Layout: filepath.Join(o.Out, img.Name), Tarball: filepath.Join(o.Out, img.Name+".tar"),
	}
	images := map[Platform]v1.Image{}
	for _, p := range o.Platforms {
		path := BinaryPath(bins, p, img)
		if img.Prebuilt != "" {
			path = img.Prebuilt
		}
		binary, err := os.ReadFile(path)
		if err != nil {
			return b, err
		}
		im, err := NewImage(img, p, binary, o.Source)
		if err != nil {
			return b, fmt.Errorf("%s: %w", p, err)
		}
		d, err := im.Digest()
		if err != nil {
			return b, err
		}
		images[p], b.Platforms[p.String()] = im, d.String()
	}
	idx, err := NewIndex(img, o.Source, images, o.Platforms)
	if err != nil {
		return b, err
	}
	d, err := idx.Digest()
	if err != nil {
		return b, err
	}
	b.Digest = d.String()
	if err := WriteLayout(b.Layout, idx, b.Ref); err != nil {
		return b, err
	}
	return b, WriteTarball(b.Layout, b.Tarball, o.Source.Time)
}

func main() {
	out := flag.String("out", ".cache/images", "folder for the image layouts, tarballs, images.json and binaries")
	platforms := flag.String("platforms", "linux/amd64,linux/arm64", "platforms to build each image for, comma separated")
	cluster := flag.String("cluster-images", "", "also build the images a real node needs (pause, test workload, and the CSI sidecars found in this `folder`, which hack/node.sh prints), for this machine's platform only")
	csiAddons := flag.String("csi-addons-sidecar", "", "with --cluster-images, also an image of the csi-addons sidecar `binary` that hack/csi-addons-sidecar.sh prints")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *out, *platforms, *cluster, *csiAddons); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out, platforms, nodeBin, csiAddons string) error {
	ps, err := ParsePlatforms(platforms)
	if err != nil {
		return err
	}
	images := Images
	if csiAddons != "" && nodeBin == "" {
		return fmt.Errorf("--csi-addons-sidecar goes with --cluster-images")
	}
	if nodeBin != "" {
		if len(ps) != 1 || ps[0] != (Platform{"linux", runtime.GOARCH}) {
			return fmt.Errorf("--cluster-images builds for this machine only: give --platforms linux/%s", runtime.GOARCH)
		}
		extra, err := ClusterImages(nodeBin, csiAddons)
		if err != nil {
			return err
		}
		images = append(slices.Clone(Images), extra...)
	}
	root, err := buildsource.Git(ctx, ".", "rev-parse", "--show-toplevel")
	if err != nil {
		return err
	}
	src, err := buildsource.Read(ctx, root, os.Getenv("SOURCE_DATE_EPOCH"))
	if err != nil {
		return err
	}
	if !filepath.IsAbs(out) {
		out = filepath.Join(root, out)
	}
	// The images a real node runs are asked for by every start of one: they are built again only
	// when what they are made from changed. `make images` always builds.
	var stamp string
	if nodeBin != "" {
		if stamp, err = inputsOf(src, ps, images); err != nil {
			return err
		}
	}
	if upToDate(out, stamp) {
		fmt.Printf("the %s images at commit %s in %s are up to date\n", src.Version, src.Commit, out)
		return nil
	}
	fmt.Printf("building %s images at commit %s, dated %s\n", src.Version, src.Commit, src.Time.Format(time.RFC3339))
	// A build that fails halfway leaves no stamp that would let the next run skip it.
	_ = os.Remove(filepath.Join(out, inputsFile))
	built, err := Run(ctx, Options{Root: root, Out: out, Source: src, Platforms: ps, Images: images, Log: os.Stdout})
	if err != nil {
		return err
	}
	if stamp != "" {
		if err := os.WriteFile(filepath.Join(out, inputsFile), []byte(stamp), 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("wrote %d images (OCI layout folder and .tar each), images.json and digests.env to %s\n", len(built), out)
	return nil
}

// inputsFile, in the output folder, describes what its images were built from.
const inputsFile = "inputs.json"

// inputsOf describes what a build makes its images from: the source, the platforms, and each
// image with the size and time of its prebuilt binary. It is "" for a source with uncommitted
// changes, which the commit does not describe: such a build is never skipped.
func inputsOf(src Source, ps []Platform, images []Image) (string, error) {
	if strings.HasSuffix(src.Commit, "-dirty") {
		return "", nil
	}
	type prebuilt struct {
		Path    string
		Size    int64
		ModTime time.Time
	}
	type input struct {
		Image
		Prebuilt  *prebuilt  `json:",omitempty"`
		HostFiles []prebuilt `json:",omitempty"`
	}
	in := struct {
		Source    Source
		Platforms []Platform
		Images    []input
	}{Source: src, Platforms: ps}
	for _, img := range images {
		i := input{Image: img}
		if img.Prebuilt != "" {
			st, err := os.Stat(img.Prebuilt)
			if err != nil {
				return "", fmt.Errorf("image %s: %w", img.Name, err)
			}
			i.Prebuilt = &prebuilt{Path: img.Prebuilt, Size: st.Size(), ModTime: st.ModTime().UTC()}
		}
		for _, f := range img.Files {
			if f.Source == "" {
				continue
			}
			st, err := os.Stat(f.Source)
			if err != nil {
				return "", fmt.Errorf("image %s: %w", img.Name, err)
			}
			i.HostFiles = append(i.HostFiles, prebuilt{Path: f.Source, Size: st.Size(), ModTime: st.ModTime().UTC()})
		}
		in.Images = append(in.Images, i)
	}
	data, err := json.MarshalIndent(in, "", "  ")
	return string(data) + "\n", err
}

// upToDate reports whether out holds the images of a build from the inputs stamp: the same
// stamp, and every image's tarball and layout still there.
func upToDate(out, stamp string) bool {
	if stamp == "" {
		return false
	}
	prev, err := os.ReadFile(filepath.Join(out, inputsFile))
	if err != nil || string(prev) != stamp {
		return false
	}
	raw, err := os.ReadFile(filepath.Join(out, "images.json"))
	if err != nil {
		return false
	}
	var built []Built
	if err := json.Unmarshal(raw, &built); err != nil || len(built) == 0 {
		return false
	}
	for _, b := range built {
		for _, path := range []string{b.Tarball, filepath.Join(b.Layout, "index.json")} {
			if _, err := os.Stat(path); err != nil {
				return false
			}
		}
	}
	return true
}
