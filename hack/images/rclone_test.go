package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

func TestParseLdd(t *testing.T) {
	out := []byte(`	linux-vdso.so.1 (0x00007ffd7f5f2000)
	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f1c2e9f6000)
	/lib64/ld-linux-x86-64.so.2 (0x00007f1c2ebeb000)
`)
	got, err := parseLdd("rclone", out)
	if want := []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("parseLdd = %q, %v; want %q", got, err, want)
	}
	if _, err := parseLdd("rclone", []byte("\tlibfuse3.so.3 => not found\n")); err == nil || !strings.Contains(err.Error(), "libfuse3.so.3") {
		t.Errorf("parseLdd of a missing library = %v, want an error naming it", err)
	}
}

// requireRcloneImageTools skips the test where the machine lacks what the rclone image is made
// of, except under CI=true, where hack/fuse.sh has installed it and a lack is a failure.
func requireRcloneImageTools(t *testing.T) {
	t.Helper()
	var missing []string
	for _, program := range []string{"rclone", "fusermount3", "ldd", "dpkg-query"} {
		if _, err := exec.LookPath(program); err != nil {
			missing = append(missing, program)
		}
	}
	if os.Geteuid() != 0 {
		missing = append(missing, "root (to run rclone in the image's files)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		missing = append(missing, "/dev/fuse")
	}
	if len(missing) == 0 {
		return
	}
	msg := "the rclone image test needs " + strings.Join(missing, ", ")
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// TestRcloneImage builds the reference driver's rclone image twice from the same inputs and
// checks what a node relies on: the same digest both times; rclone, fusermount3, the fusermount
// link and every library they load in the image, with a PATH that finds them; and rclone mount,
// run from the image's files alone (a chroot of its layer), mounts a folder, serves it, and
// leaves a dead mount (ENOTCONN) when it is killed, as the reference driver's own mounter does.
func TestRcloneImage(t *testing.T) {
	requireRcloneImageTools(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	img, err := RcloneImage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The refdriver binary is what every other image test checks; a stand-in keeps this test
	// from building it.
	img.Prebuilt = filepath.Join(t.TempDir(), "refdriver")
	if err := os.WriteFile(img.Prebuilt, []byte("refdriver stand-in"), 0o755); err != nil {
		t.Fatal(err)
	}
	src := Source{Version: "v0.0.0", Commit: "0123abcd", Time: time.Unix(1700000000, 0).UTC()}
	ps := []Platform{{"linux", runtime.GOARCH}}
	var built []Built
	for range 2 {
		out := t.TempDir()
		b, err := Run(ctx, Options{Root: repoRoot(t), Out: out, Binaries: filepath.Join(out, "bin"), Source: src, Platforms: ps, Images: []Image{img}})
		if err != nil {
			t.Fatal(err)
		}
		built = append(built, b[0])
	}
	if built[0].Digest != built[1].Digest {
		t.Fatalf("two builds from the same inputs: digests %s and %s", built[0].Digest, built[1].Digest)
	}
	if built[0].Ref != rcloneImageName+":v0.0.0" {
		t.Errorf("ref %s, want %s:v0.0.0", built[0].Ref, rcloneImageName)
	}

	idx := layoutIndex(t, built[0].Layout, built[0].Ref)
	m, err := idx.IndexManifest()
	if err != nil || len(m.Manifests) != 1 {
		t.Fatalf("index: %v, %v; want one image", m, err)
	}
	im, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := im.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cf.Config.Env, "PATH=/:/usr/bin") {
		t.Errorf("environment %q: want PATH=/:/usr/bin, so that the plugin finds rclone and rclone fusermount", cf.Config.Env)
	}
	if d := cf.Config.Labels[LabelDesc]; !strings.Contains(d, "rclone ") || !strings.Contains(d, "fuse3 ") {
		t.Errorf("description %q does not name the package versions", d)
	}
	root := t.TempDir()
	unpackLayers(t, im, root)
	for _, f := range img.Files {
		if f.Link != "" {
			if got, err := os.Readlink(filepath.Join(root, f.Path)); err != nil || got != f.Link {
				t.Errorf("%s in the image links to %q, %v; want %q", f.Path, got, err, f.Link)
			}
			continue
		}
		want, err := os.ReadFile(f.Source)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(filepath.Join(root, f.Path)); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s in the image is not %s of this machine (%v)", f.Path, f.Source, err)
		}
	}
	for _, want := range []string{"/usr/bin/rclone", "/usr/bin/fusermount3", "/usr/bin/fusermount"} {
		if !slices.ContainsFunc(img.Files, func(f HostFile) bool { return f.Path == want }) {
			t.Errorf("the image has no %s", want)
		}
	}

	runRcloneIn(t, root, cf.Config.Env)
}

// unpackLayers writes the image's files, folders and links under dir.
func unpackLayers(t *testing.T, im v1.Image, dir string) {
	t.Helper()
	layers, err := im.Layers()
	if err != nil {
		t.Fatal(err)
	}
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
			path := filepath.Join(dir, h.Name)
			switch h.Typeflag {
			case tar.TypeDir:
				err = os.MkdirAll(path, os.FileMode(h.Mode).Perm())
			case tar.TypeSymlink:
				err = os.Symlink(h.Linkname, path)
			case tar.TypeReg:
				var data []byte
				if data, err = io.ReadAll(tr); err == nil {
					err = os.WriteFile(path, data, os.FileMode(h.Mode).Perm())
				}
			}
			if err != nil {
				t.Fatalf("unpack %s: %v", h.Name, err)
			}
		}
		_ = rc.Close()
	}
}

// runRcloneIn runs rclone mount with root as its root folder (and the machine's /dev and a
// /proc), serving a folder of the image at /mnt, and checks the mount works and turns dead when
// rclone is killed.
func runRcloneIn(t *testing.T, root string, env []string) {
	t.Helper()
	for _, dir := range []string{"dev", "proc", "data", "mnt"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "data", "f"), []byte("served by rclone"), 0o644); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(root, "mnt")
	for _, m := range []struct{ source, target, fstype string }{{"/dev", "dev", ""}, {"proc", "proc", "proc"}} {
		flags := uintptr(0)
		if m.fstype == "" {
			flags = unix.MS_BIND
		}
		if err := unix.Mount(m.source, filepath.Join(root, m.target), m.fstype, flags, ""); err != nil {
			t.Fatalf("mount %s in the image's root: %v", m.target, err)
		}
		target := filepath.Join(root, m.target)
		t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })

	var log bytes.Buffer
	cmd := exec.Command("/usr/bin/rclone", "mount", "/data", "/mnt", "--config", "/dev/null", "--devname", "image-test",
		"--allow-other", "--vfs-cache-mode", "off")
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start rclone in the image's root: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := os.ReadFile(filepath.Join(mnt, "f"))
		if err == nil && string(got) == "served by rclone" && mountedFUSE(t, mnt) {
			break
		}
		select {
		case <-exited:
			t.Fatalf("rclone exited before it mounted: %s", log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("rclone did not serve the folder within 30s (last read: %q, %v): %s", got, err, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited
	if _, err := os.ReadFile(filepath.Join(mnt, "f")); !errors.Is(err, syscall.ENOTCONN) && !errors.Is(err, syscall.ECONNABORTED) {
		t.Errorf("reading the mount of a killed rclone: %v, want ENOTCONN", err)
	}
}

// mountedFUSE tells whether rclone's FUSE mount is at path.
func mountedFUSE(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 8 && f[4] == path && slices.Contains(f, "fuse.rclone") {
			return true
		}
	}
	return false
}
