// Package versionmetrics exposes a binary's build (package version) as the metric
// volume_healer_build_info. It lives apart from package version so that binaries without metrics
// (the reference driver, healerctl) do not link the Prometheus client for it.
//
// It owns that one gauge and its labels; the binaries that serve metrics register it on their
// own registry. Of volume-healer it imports only package version, and it must not import a
// pipeline stage, cmd/ or test/: every binary with metrics links it.
package versionmetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/volume-healer/volume-healer/version"
)

// BuildInfoName is the name of the build info gauge.
const BuildInfoName = "volume_healer_build_info"

// NewBuildInfo returns the gauge volume_healer_build_info{version,commit,goversion}, set to 1 for
// info: a constant series that tells which build each scraped process runs, to join on in
// queries (`* on (instance) group_left (version) volume_healer_build_info`).
func NewBuildInfo(info version.Info) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: BuildInfoName,
		Help: "Always 1; its labels name the version, the git commit and the Go version this process was built from.",
	}, []string{"version", "commit", "goversion"})
	g.WithLabelValues(info.Version, info.Commit, info.GoVersion).Set(1)
	return g
}
