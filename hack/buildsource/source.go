// Package buildsource reads what the project's release tools (hack/images, hack/release) build
// from and stamp their binaries with: the version of the VERSION file, the git commit and the time
// every file of their output carries. One reader, so that the images and the release archives
// name a build the same way.
package buildsource

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Module is the project's Go module path.
const Module = "github.com/volume-healer/volume-healer"

// Source is what a build is made from and stamped with.
type Source struct {
	// Version is "v" and the VERSION file's content, such as v0.1.0.
	Version string
	// Commit is the git commit, with "-dirty" when tracked files differ from it.
	Commit string
	// Time is SOURCE_DATE_EPOCH when set, else the commit's time: every time in the output.
	Time time.Time
}

// Read reads the version file and the git state of the repository at root; epoch is the value of
// SOURCE_DATE_EPOCH ("" for the commit's time).
func Read(ctx context.Context, root, epoch string) (Source, error) {
	raw, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		return Source{}, fmt.Errorf("version file: %w", err)
	}
	v := strings.TrimSpace(string(raw))
	if v == "" || strings.HasPrefix(v, "v") || strings.ContainsAny(v, " \t\n/:@") {
		return Source{}, fmt.Errorf("VERSION holds %q: want a version without the v, such as 0.1.0", v)
	}
	commit, err := Git(ctx, root, "rev-parse", "HEAD")
	if err != nil {
		return Source{}, err
	}
	status, err := Git(ctx, root, "status", "--porcelain", "--untracked-files=no")
	if err != nil {
		return Source{}, err
	}
	if status != "" {
		commit += "-dirty"
	}
	if epoch == "" {
		if epoch, err = Git(ctx, root, "log", "-1", "--format=%ct", "HEAD"); err != nil {
			return Source{}, err
		}
	}
	secs, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		return Source{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since 1970: %w", epoch, err)
	}
	return Source{Version: "v" + v, Commit: commit, Time: time.Unix(secs, 0).UTC()}, nil
}

// Git runs git with args in root and returns its output, trimmed; an error carries git's stderr.
func Git(ctx context.Context, root string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s in %s: %w: %s", strings.Join(args, " "), root, err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// LDFlags are the linker flags of every released binary: no symbol table nor DWARF (smaller
// binaries; stack traces keep their function names and lines), and the version and commit for
// --version.
func (s Source) LDFlags() string {
	return fmt.Sprintf("-s -w -X %s/version.version=%s -X %s/version.commit=%s", Module, s.Version, Module, s.Commit)
}
