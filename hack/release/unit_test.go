package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

var epoch = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// readArchive lists a tar.gz's headers and contents. It decompresses with gzip where there is
// one: Go's inflate under the race detector takes a minute for the release's archives.
func readArchive(t *testing.T, path string) ([]*tar.Header, map[string][]byte) {
	t.Helper()
	var r io.Reader
	if gz, err := exec.LookPath("gzip"); err == nil {
		out, err := exec.Command(gz, "-dc", path).Output()
		if err != nil {
			t.Fatalf("gzip -dc %s: %v", path, err)
		}
		r = bytes.NewReader(out)
	} else {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = f.Close() }()
		if r, err = gzip.NewReader(f); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	tr := tar.NewReader(r)
	var headers []*tar.Header
	data := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		headers, data[h.Name] = append(headers, h), b
	}
	return headers, data
}

func TestWriteArchiveIsReproducibleAndOwnedByRoot(t *testing.T) {
	dir := t.TempDir()
	files := []File{{Name: "healerctl", Mode: 0o755, Data: []byte("binary")}, {Name: "LICENSE", Mode: 0o644, Data: []byte("license")}}
	a, b := filepath.Join(dir, "a.tar.gz"), filepath.Join(dir, "b.tar.gz")
	if err := WriteArchive(a, files, epoch); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // a second later: no clock may leak into the bytes
	if err := WriteArchive(b, files, epoch); err != nil {
		t.Fatal(err)
	}
	da, _ := os.ReadFile(a)
	db, _ := os.ReadFile(b)
	if !bytes.Equal(da, db) {
		t.Fatal("two archives of the same files differ")
	}
	headers, data := readArchive(t, a)
	if len(headers) != 2 || headers[0].Name != "healerctl" || headers[1].Name != "LICENSE" {
		t.Fatalf("archive holds %v, want healerctl then LICENSE", headers)
	}
	for _, h := range headers {
		if !h.ModTime.Equal(epoch) || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: time %s, owner %d:%d (%q:%q); want %s, 0:0 without names", h.Name, h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname, epoch)
		}
	}
	if headers[0].Mode != 0o755 || string(data["healerctl"]) != "binary" {
		t.Errorf("healerctl: mode %o, content %q", headers[0].Mode, data["healerctl"])
	}
}

// helmLike writes a package as helm package does: helm's gzip comment, every file stamped now.
func helmLike(t *testing.T, path string, now time.Time) {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Header.Comment = "Helm"
	zw.Header.Extra = []byte("extra")
	tw := tar.NewWriter(zw)
	for _, f := range []struct{ name, body string }{{"c/Chart.yaml", "name: c\n"}, {"c/values.yaml", "a: 1\n"}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), ModTime: now}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(tw.Close(), zw.Close()); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestNormalizeChartRemovesThePackagingTime(t *testing.T) {
	dir := t.TempDir()
	in1, in2 := filepath.Join(dir, "1.tgz"), filepath.Join(dir, "2.tgz")
	helmLike(t, in1, time.Now())
	helmLike(t, in2, time.Now().Add(time.Hour))
	if d1, d2 := mustRead(t, in1), mustRead(t, in2); bytes.Equal(d1, d2) {
		t.Fatal("the packages stamped an hour apart are equal: the test shows nothing")
	}
	out1, out2 := filepath.Join(dir, "o1.tgz"), filepath.Join(dir, "o2.tgz")
	for _, p := range [][2]string{{in1, out1}, {in2, out2}} {
		if err := NormalizeChart(p[0], p[1], epoch); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(mustRead(t, out1), mustRead(t, out2)) {
		t.Fatal("the normalized packages differ")
	}
	headers, data := readArchive(t, out1)
	if len(headers) != 2 || headers[0].Name != "c/Chart.yaml" || string(data["c/values.yaml"]) != "a: 1\n" {
		t.Fatalf("normalized package holds %v", data)
	}
	f, _ := os.Open(out1)
	defer func() { _ = f.Close() }()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	if zr.Comment != "Helm" || string(zr.Extra) != "extra" {
		t.Errorf("gzip header: comment %q, extra %q; want helm's kept", zr.Comment, zr.Extra)
	}
}

func TestNormalizeChartRefusesWhatIsNoPackage(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.tgz")
	if err := os.WriteFile(in, []byte("not gzip"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := NormalizeChart(in, filepath.Join(dir, "out.tgz"), epoch)
	if err == nil || !strings.Contains(err.Error(), in) {
		t.Fatalf("NormalizeChart of a file that is no gzip: %v, want an error naming it", err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestKrewManifestRefusesABadChecksum(t *testing.T) {
	_, err := KrewManifest("v0.1.0", []KrewPlatform{{Platform: Platform{"linux", "amd64"}, URI: "https://example.com/a.tar.gz", SHA256: "abc", Bin: "kubectl-healer"}})
	if err == nil || !strings.Contains(err.Error(), "linux/amd64") {
		t.Fatalf("KrewManifest with sha256 abc: %v, want an error naming the platform", err)
	}
	_, err = KrewManifest("v0.1.0", nil)
	if err == nil {
		t.Fatal("KrewManifest without platforms: no error")
	}
}

func TestSBOMListsTheModulesOfTheBuild(t *testing.T) {
	info := &debug.BuildInfo{
		GoVersion: "go1.26.8", Path: module + "/cmd/healerctl",
		Main: debug.Module{Path: module, Version: "(devel)"},
		Deps: []*debug.Module{
			{Path: "google.golang.org/grpc", Version: "v1.85.0", Sum: "h1:abc="},
			{Path: "example.com/old", Version: "v1.0.0", Replace: &debug.Module{Path: "example.com/new", Version: "v1.1.0", Sum: "h1:def="}},
		},
		Settings: []debug.BuildSetting{{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "arm64"}, {Key: "CGO_ENABLED", Value: "0"}},
	}
	src := Source{Version: "v0.1.0", Commit: "0123", Time: epoch}
	bom, err := SBOM("healerctl", []byte("binary"), info, src)
	if err != nil {
		t.Fatal(err)
	}
	versions := map[string]string{}
	for _, c := range *bom.Components {
		versions[c.Name] = c.Version
	}
	want := map[string]string{"google.golang.org/grpc": "v1.85.0", "example.com/new": "v1.1.0", "stdlib": "go1.26.8"}
	for name, v := range want {
		if versions[name] != v {
			t.Errorf("component %s: version %q, want %q (components %v)", name, versions[name], v, versions)
		}
	}
	if _, ok := versions["example.com/old"]; ok {
		t.Error("the replaced module is listed; want its replacement only")
	}
	c := bom.Metadata.Component
	sum := sha256.Sum256([]byte("binary"))
	if c.Name != "healerctl" || c.Version != "v0.1.0" || c.Hashes == nil || (*c.Hashes)[0].Value != hex.EncodeToString(sum[:]) {
		t.Errorf("metadata component: %+v", c)
	}
	if bom.Metadata.Timestamp != "2026-12-01T10:00:00Z" {
		t.Errorf("timestamp %q, want the source's time", bom.Metadata.Timestamp)
	}
	var buf bytes.Buffer
	if err := cdx.NewBOMEncoder(&buf, cdx.BOMFileFormatJSON).EncodeVersion(bom, SBOMSpec); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"specVersion":"1.6"`) {
		t.Errorf("encoded SBOM is not CycloneDX 1.6: %.200s", buf.String())
	}

	info.Settings = nil
	if _, err := SBOM("healerctl", []byte("binary"), info, src); err == nil {
		t.Error("SBOM of a build without GOOS and GOARCH: no error")
	}
}

func TestCheckReplaceableRefusesAFolderThatIsNoRelease(t *testing.T) {
	dir := t.TempDir()
	if err := checkReplaceable(filepath.Join(dir, "missing")); err != nil {
		t.Errorf("a missing folder: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkReplaceable(dir); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("a folder with notes.txt and no %s: %v, want a refusal naming it", SumsFile, err)
	}
	if err := os.WriteFile(filepath.Join(dir, SumsFile), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkReplaceable(dir); err != nil {
		t.Errorf("a release folder: %v", err)
	}
}
