// Package version tells which build of volume-healer a binary is: the release version and the
// commit it was built from, stamped at link time, and the Go version that built it. Every binary
// prints it for --version, and the controller and the sidecar expose it as the metric
// volume_healer_build_info (package versionmetrics).
//
// The release version comes from the VERSION file at the repository's root; `make build` and
// `make images` (hack/images) stamp it and the commit with
//
//	-ldflags "-X github.com/volume-healer/volume-healer/version.version=v0.1.0
//	          -X github.com/volume-healer/volume-healer/version.commit=<git commit>"
//
// A binary built without them (go build, go run, go test) falls back to what the Go toolchain
// recorded in it (runtime/debug.ReadBuildInfo), and says "unknown" for what it did not record.
//
// It imports nothing of the project, so that every binary can import it.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set at link time with -ldflags -X; empty otherwise.
var (
	version string
	commit  string
)

// Unknown stands for a version or commit that the build did not record.
const Unknown = "unknown"

// Info describes one build.
type Info struct {
	// Version is the release version, such as v0.1.0.
	Version string `json:"version"`
	// Commit is the git commit the binary was built from, with the suffix "-dirty" when the work
	// tree held changes to it.
	Commit string `json:"commit"`
	// GoVersion is the Go toolchain that built the binary, such as go1.26.8.
	GoVersion string `json:"goVersion"`
	// Platform is the operating system and architecture the binary runs on, such as linux/amd64.
	Platform string `json:"platform"`
}

// Get returns the build of the running binary.
func Get() Info {
	info := Info{Version: version, Commit: commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		fromBuildInfo(&info, bi)
	}
	if info.Version == "" {
		info.Version = Unknown
	}
	if info.Commit == "" {
		info.Commit = Unknown
	}
	return info
}

// fromBuildInfo fills what the link-time flags left empty from what the Go toolchain recorded: the
// main module's version (set by go install of a tagged version, or derived from the VCS) and the
// VCS revision (when built with -buildvcs in a git work tree).
func fromBuildInfo(info *Info, bi *debug.BuildInfo) {
	if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		info.Version = bi.Main.Version
	}
	if info.Commit != "" {
		return
	}
	var revision, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if revision != "" {
		info.Commit = revision
		if modified == "true" {
			info.Commit += "-dirty"
		}
	}
}

// String is the one line that --version prints after the program's name:
// "v0.1.0 (commit 3b1d715..., go1.26.8, linux/amd64)".
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, %s, %s)", i.Version, i.Commit, i.GoVersion, i.Platform)
}

// Line is what --version prints for program: its name, then String.
func Line(program string) string {
	return program + " " + Get().String()
}
