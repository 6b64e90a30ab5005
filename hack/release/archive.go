package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// File is one regular file of an archive.
type File struct {
	// Name is the file's path in the archive, with forward slashes.
	Name string
	// Mode is its permission bits.
	Mode int64
	// Data is its content.
	Data []byte
}

// WriteArchive writes files as a gzipped tar archive to path, reproducibly: in the order given,
// every time mtime, owner and group root (0, no names), the modes given, and a gzip header without
// name or time.
func WriteArchive(path string, files []File, mtime time.Time) error {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	for _, f := range files {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: f.Name, Mode: f.Mode, Size: int64(len(f.Data)), ModTime: mtime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("%s: %s: %w", path, f.Name, err)
		}
		if _, err := tw.Write(f.Data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// FolderFiles lists the regular files below dir, sorted by path, each named prefix/<path below
// dir> and with mode 0644. A folder holding anything else (a link, a device) is refused.
func FolderFiles(dir, prefix string) ([]File, error) {
	var files []File
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file, which an archive of %s cannot hold", p, dir)
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, File{Name: path.Join(prefix, filepath.ToSlash(rel)), Mode: 0o644, Data: data})
		return nil
	})
	slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Name, b.Name) })
	return files, err
}

// NormalizeChart copies the chart package that helm package wrote at from to to, with every
// file's time set to mtime and its owner to root: helm stamps each file with the time of the
// packaging, which makes two packages of one chart differ. The files, their order and modes, and
// helm's gzip header (its comment and extra field) stay as helm wrote them.
func NormalizeChart(from, to string, mtime time.Time) error {
	f, err := os.Open(from)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return err
	}
	zw.Header = gzip.Header{Comment: zr.Comment, Extra: zr.Extra, OS: zr.OS}
	tr := tar.NewReader(zr)
	tw := tar.NewWriter(zw)
	n := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%s: %w", from, err)
		}
		if h.Typeflag != tar.TypeReg {
			return fmt.Errorf("%s: %s is not a regular file, which helm package does not write", from, h.Name)
		}
		out := &tar.Header{Typeflag: tar.TypeReg, Name: h.Name, Mode: h.Mode, Size: h.Size, ModTime: mtime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(out); err != nil {
			return fmt.Errorf("%s: %s: %w", from, h.Name, err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("%s: an empty chart package", from)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(to, buf.Bytes(), 0o644)
}
