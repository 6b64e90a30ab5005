package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// rcloneImageName is the reference driver's image with rclone in it, for `refdriver --mounter
// rclone` on a real node.
const rcloneImageName = "healer-refdriver-rclone"

// RcloneImage is the reference driver's image with the third-party FUSE mounter it can run
// (refdriver --mounter rclone): the refdriver binary, and from this machine's packages (Debian's
// rclone and fuse3, which hack/fuse.sh installs) /usr/bin/rclone, /usr/bin/fusermount3 with the
// /usr/bin/fusermount link rclone runs, and the shared libraries and loader both load, as ldd
// lists them. Its PATH finds rclone and fusermount. Built for the machine's own platform only;
// its bytes are the same on machines with the same package versions, which its description
// names.
func RcloneImage(ctx context.Context) (Image, error) {
	img := Image{Name: rcloneImageName, Package: "./cmd/refdriver", Binary: "refdriver", Path: "/:/usr/bin"}
	var programs []string
	for _, name := range []string{"rclone", "fusermount3"} {
		path, err := exec.LookPath(name)
		if err != nil {
			return Image{}, fmt.Errorf("image %s: %w (hack/fuse.sh installs rclone and fuse3)", rcloneImageName, err)
		}
		programs = append(programs, path)
		img.Files = append(img.Files, HostFile{Path: "/usr/bin/" + name, Source: path})
	}
	img.Files = append(img.Files, HostFile{Path: "/usr/bin/fusermount", Link: "fusermount3"})
	seen := map[string]bool{}
	for _, program := range programs {
		libs, err := sharedLibraries(ctx, program)
		if err != nil {
			return Image{}, fmt.Errorf("image %s: %w", rcloneImageName, err)
		}
		for _, lib := range libs {
			if seen[lib] {
				continue
			}
			seen[lib] = true
			// The file the loader opens, symbolic links followed: the image has no links
			// but fusermount's.
			real, err := filepath.EvalSymlinks(lib)
			if err != nil {
				return Image{}, fmt.Errorf("image %s: %w", rcloneImageName, err)
			}
			img.Files = append(img.Files, HostFile{Path: lib, Source: real})
		}
	}
	slices.SortFunc(img.Files, func(a, b HostFile) int { return strings.Compare(a.Path, b.Path) })
	versions, err := packageVersions(ctx, "rclone", "fuse3", "libc6")
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", rcloneImageName, err)
	}
	img.Description = "volume-healer reference driver with rclone mount as its FUSE mounter (refdriver --mounter rclone); from Debian: " + versions
	return img, nil
}

// sharedLibraries lists the shared libraries and the loader a dynamic program loads, as ldd
// prints them (the paths the loader opens); none for a static one.
func sharedLibraries(ctx context.Context, program string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ldd", program).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %w: %s", program, err, bytes.TrimSpace(out))
	}
	return parseLdd(program, out)
}

// parseLdd reads ldd's output: "name => /path (0x...)" for a library, "/path (0x...)" for the
// loader, "linux-vdso.so.1 (0x...)" for the kernel's, which is no file.
func parseLdd(program string, out []byte) ([]string, error) {
	var libs []string
	s := bufio.NewScanner(bytes.NewReader(out))
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "linux-vdso") || strings.HasPrefix(line, "linux-gate") {
			continue
		}
		if strings.Contains(line, "=> not found") {
			return nil, fmt.Errorf("%s needs a library this machine lacks: %s", program, line)
		}
		if _, after, ok := strings.Cut(line, "=> "); ok {
			line = after
		}
		path, _, _ := strings.Cut(line, " ")
		if !filepath.IsAbs(path) {
			return nil, fmt.Errorf("ldd %s: cannot read %q", program, s.Text())
		}
		libs = append(libs, path)
	}
	return libs, s.Err()
}

// packageVersions names the installed versions of Debian packages, "rclone 1.60.1+dfsg-2+b5, ...".
func packageVersions(ctx context.Context, names ...string) (string, error) {
	args := append([]string{"-W", "-f", "${Package} ${Version}\n"}, names...)
	out, err := exec.CommandContext(ctx, "dpkg-query", args...).Output()
	if err != nil {
		return "", fmt.Errorf("dpkg-query %s: %w (the image is made of Debian's packages)", strings.Join(names, " "), err)
	}
	return strings.Join(strings.Split(strings.TrimSpace(string(out)), "\n"), ", "), nil
}
