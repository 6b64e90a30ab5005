package main

import (
	"fmt"
	"regexp"
	"strings"
)

// KrewPluginName is the plugin's name in krew: `kubectl krew install healer`, `kubectl healer`.
const KrewPluginName = "healer"

// KrewPlatform is one platform of the krew manifest: the archive to download and what to run.
type KrewPlatform struct {
	Platform
	// URI is where krew downloads the archive.
	URI string
	// SHA256 is the archive's SHA-256, in hex.
	SHA256 string
	// Bin is the executable's path in the archive.
	Bin string
}

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// KrewManifest is the krew plugin manifest (krew.googlecontainertools.github.com/v1alpha2) of
// kubectl-healer at version, one platform each. The platforms' order is the one given.
func KrewManifest(version string, platforms []KrewPlatform) ([]byte, error) {
	if len(platforms) == 0 {
		return nil, fmt.Errorf("krew manifest: no platform")
	}
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: %s
spec:
  version: %s
  homepage: %s
  shortDescription: Show and steer volume-healer's healing of CSI volumes
  description: |
    healerctl of volume-healer, a controller that keeps CSI volumes usable after their
    driver's node plugin restarts, as a kubectl plugin: status shows what the healer is
    doing in the cluster, sweep requests a sweep of a StorageClass, claim or node,
    policy tests and evaluates healing policies, sanity checks a driver against the
    healer protocol.
  platforms:
`, KrewPluginName, version, Homepage)
	for _, p := range platforms {
		if !sha256Hex.MatchString(p.SHA256) {
			return nil, fmt.Errorf("krew manifest: platform %s: sha256 %q is not 64 lowercase hex digits", p.Platform, p.SHA256)
		}
		if !strings.Contains(p.URI, "://") {
			return nil, fmt.Errorf("krew manifest: platform %s: uri %q is no URL", p.Platform, p.URI)
		}
		fmt.Fprintf(&b, `    - selector:
        matchLabels:
          os: %s
          arch: %s
      uri: %s
      sha256: %s
      bin: %s
      files:
        - from: %s
          to: .
        - from: LICENSE
          to: .
`, p.OS, p.Arch, p.URI, p.SHA256, p.Bin, p.Bin)
	}
	return []byte(b.String()), nil
}
