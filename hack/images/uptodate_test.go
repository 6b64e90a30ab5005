package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestNodeImagesUpToDate checks when a real node's images are built again: whenever the commit,
// a prebuilt binary or an output file changed, and never for a source with uncommitted changes.
func TestNodeImagesUpToDate(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	bin := filepath.Join(dir, "csi-attacher")
	write := func(path, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(bin, "a static binary")
	src := Source{Version: "v0.1.0", Commit: "0123abcd", Time: time.Unix(1, 0).UTC()}
	ps := []Platform{{"linux", "amd64"}}
	images := []Image{Images[0], {Name: "csi-attacher", Binary: "csi-attacher", Prebuilt: bin, Tag: "v4.13.0"}}
	stamp := func(s Source) string {
		t.Helper()
		st, err := inputsOf(s, ps, images)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	// What a build leaves: the layouts, the tarballs, images.json and the stamp.
	var built []Built
	for _, img := range images {
		b := Built{Name: img.Name, Layout: filepath.Join(out, img.Name), Tarball: filepath.Join(out, img.Name+".tar")}
		write(filepath.Join(b.Layout, "index.json"), "{}")
		write(b.Tarball, "tar")
		built = append(built, b)
	}
	data, err := json.Marshal(built)
	if err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(out, "images.json"), string(data))
	first := stamp(src)
	write(filepath.Join(out, inputsFile), first)

	if !upToDate(out, first) {
		t.Fatal("the images of the same inputs are not up to date")
	}
	if s := stamp(Source{Version: src.Version, Commit: "4567cdef", Time: src.Time}); upToDate(out, s) {
		t.Error("the images of another commit are up to date")
	}
	if s := stamp(Source{Version: src.Version, Commit: src.Commit + "-dirty", Time: src.Time}); s != "" || upToDate(out, s) {
		t.Errorf("a source with uncommitted changes has the stamp %q", s)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(bin, later, later); err != nil {
		t.Fatal(err)
	}
	if upToDate(out, stamp(src)) {
		t.Error("the images are up to date although a prebuilt binary changed")
	}
	if err := os.Remove(built[1].Tarball); err != nil {
		t.Fatal(err)
	}
	if upToDate(out, first) {
		t.Error("the images are up to date although a tarball is gone")
	}
}
