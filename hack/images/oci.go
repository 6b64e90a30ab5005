package main

import (
	"archive/tar"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// passwd and group name the image's users: root owns the files, 65532 runs the binary.
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group  = "root:x:0:\nnonroot:x:65532:\n"
)

// layerEntry is one entry of a layer: a folder, a file or a symbolic link.
type layerEntry struct {
	name string
	mode int64
	data []byte
	dir  bool
	link string
}

// Layer returns the image's one layer, uncompressed: /etc/passwd, /etc/group, /tmp (writable by
// all, sticky, for programs that need a temporary file) and the binary at /<name>, then the
// host files (their folders first, in path order; files mode 0755, their content read now),
// every entry owned by root and dated mtime.
func Layer(name string, binary []byte, files []HostFile, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries := []layerEntry{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: name, mode: 0o755, data: binary},
	}
	more, err := hostEntries(files)
	if err != nil {
		return nil, err
	}
	entries = append(entries, more...)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: mtime, Format: tar.FormatPAX}
		switch {
		case e.dir:
			h.Typeflag = tar.TypeDir
		case e.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// hostEntries are the layer entries of files: each folder on their paths that the layer does not
// have yet, then each file, in path order.
func hostEntries(files []HostFile) ([]layerEntry, error) {
	have := map[string]bool{"etc/": true, "tmp/": true}
	var dirs, out []layerEntry
	sorted := slices.Clone(files)
	slices.SortFunc(sorted, func(a, b HostFile) int { return strings.Compare(a.Path, b.Path) })
	for _, f := range sorted {
		if !filepath.IsAbs(f.Path) || filepath.Clean(f.Path) != f.Path || (f.Source == "") == (f.Link == "") {
			return nil, fmt.Errorf("host file %+v: want a clean absolute path and either a source or a link", f)
		}
		rel := strings.TrimPrefix(f.Path, "/")
		for dir := filepath.Dir(rel); dir != "."; dir = filepath.Dir(dir) {
			if !have[dir+"/"] {
				have[dir+"/"] = true
				dirs = append(dirs, layerEntry{name: dir + "/", mode: 0o755, dir: true})
			}
		}
		if f.Link != "" {
			out = append(out, layerEntry{name: rel, mode: 0o777, link: f.Link})
			continue
		}
		data, err := os.ReadFile(f.Source)
		if err != nil {
			return nil, fmt.Errorf("host file %s: %w", f.Path, err)
		}
		out = append(out, layerEntry{name: rel, mode: 0o755, data: data})
	}
	slices.SortFunc(dirs, func(a, b layerEntry) int { return strings.Compare(a.name, b.name) })
	return append(dirs, out...), nil
}

// Labels are the OCI labels of img's images and annotations of its index.
func Labels(img Image, src Source) map[string]string {
	return map[string]string{
		LabelSource:   sourceURL,
		LabelRevision: src.Commit,
		LabelVersion:  src.Version,
		LabelCreated:  src.Time.Format(time.RFC3339),
		LabelTitle:    img.Name,
		LabelDesc:     img.Description,
	}
}

// NewImage returns img's image for p, from its binary.
func NewImage(img Image, p Platform, binary []byte, src Source) (v1.Image, error) {
	raw, err := Layer(img.Binary, binary, img.Files, src.Time)
	if err != nil {
		return nil, err
	}
	// Compressed once: the digest and the layout's blob are the same gzip stream.
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	out, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{
		Created:   v1.Time{Time: src.Time},
		CreatedBy: createdBy(img),
	}})
	if err != nil {
		return nil, err
	}
	cfg, err := out.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = p.OS, p.Arch
	cfg.Created = v1.Time{Time: src.Time}
	cfg.Author = sourceURL
	cfg.Config = v1.Config{
		Entrypoint: []string{"/" + img.Binary},
		User:       User,
		WorkingDir: "/",
		Env:        []string{"PATH=" + cmp.Or(img.Path, "/")},
		Labels:     Labels(img, src),
	}
	return mutate.ConfigFile(out, cfg)
}

// createdBy is the history line of img's layer.
func createdBy(img Image) string {
	line := "hack/images: /" + img.Binary + " from " + img.Package
	if len(img.Files) > 0 {
		paths := make([]string, 0, len(img.Files))
		for _, f := range img.Files {
			paths = append(paths, f.Path)
		}
		line += ", with " + strings.Join(paths, " ") + " from this machine"
	}
	return line
}

// NewIndex returns the image index of img over the platforms' images.
func NewIndex(img Image, src Source, images map[Platform]v1.Image, platforms []Platform) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        images[p],
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: p.OS, Architecture: p.Arch}},
		})
	}
	annotated, ok := mutate.Annotations(idx, Labels(img, src)).(v1.ImageIndex)
	if !ok {
		return nil, errors.New("annotating the image index gave no index")
	}
	return annotated, nil
}

// WriteLayout writes idx as the one entry of a new OCI image layout in dir, named ref.
func WriteLayout(dir string, idx v1.ImageIndex, ref string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{refNameAnnotation: ref})); err != nil {
		return fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	return nil
}

// WriteTarball writes the layout in dir as one tar file (an OCI archive): its files in order of
// name, each owned by root, dated mtime, 0644 and folders 0755.
func WriteTarball(dir, file string, mtime time.Time) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			names = append(names, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	slices.Sort(names)
	tmp := file + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp) }()
	tw := tar.NewWriter(f)
	for _, p := range names {
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: mtime, Format: tar.FormatPAX}
		switch {
		case info.IsDir():
			h.Typeflag, h.Mode, h.Name = tar.TypeDir, 0o755, h.Name+"/"
		case info.Mode().IsRegular():
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, info.Size()
		default:
			return fmt.Errorf("%s: neither a file nor a folder", p)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if err := copyFile(tw, p); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

func copyFile(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	_, err = io.Copy(w, f)
	return err
}
