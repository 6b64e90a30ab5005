package main

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

// SBOMSpec is the CycloneDX version of the SBOMs.
const SBOMSpec = cdx.SpecVersion1_6

// writeSBOM writes the SBOM of the binary at bin, named name, to path.
func writeSBOM(path, bin, name string, src Source) error {
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	info, err := buildinfo.Read(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%s: no Go build information: %w", bin, err)
	}
	bom, err := SBOM(name, data, info, src)
	if err != nil {
		return fmt.Errorf("%s: %w", bin, err)
	}
	var buf bytes.Buffer
	if err := cdx.NewBOMEncoder(&buf, cdx.BOMFileFormatJSON).SetPretty(true).EncodeVersion(bom, SBOMSpec); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// purl is the package URL of a Go module at a version.
func purl(module, version string) string {
	return "pkg:golang/" + module + "@" + version
}

// SBOM describes the binary data, named name, from its Go build information: the binary itself
// (the release's version, its SHA-256, the Go version, platform and build settings) as the
// metadata's component, and as components every module linked into it, with the version (and
// the replacement) the build recorded, and the Go standard library. Everything in it follows
// from the binary and src, so the same binary gives the same bytes.
func SBOM(name string, data []byte, info *debug.BuildInfo, src Source) (*cdx.BOM, error) {
	if info.Main.Path == "" {
		return nil, fmt.Errorf("the build information names no main module")
	}
	sum := sha256.Sum256(data)
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	platform := settings["GOOS"] + "/" + settings["GOARCH"]
	if settings["GOOS"] == "" || settings["GOARCH"] == "" {
		return nil, fmt.Errorf("the build information records no GOOS and GOARCH")
	}
	mainRef := purl(info.Main.Path, src.Version) + "?type=" + name + "&platform=" + platform
	main := cdx.Component{
		BOMRef: mainRef, Type: cdx.ComponentTypeApplication, Name: name, Version: src.Version,
		Description: "the " + name + " binary for " + platform + ", package " + info.Path,
		PackageURL:  purl(info.Main.Path, src.Version),
		Hashes:      &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: hex.EncodeToString(sum[:])}},
		Licenses:    &cdx.Licenses{{License: &cdx.License{ID: "Apache-2.0"}}},
		ExternalReferences: &[]cdx.ExternalReference{
			{Type: cdx.ERTypeVCS, URL: Homepage},
		},
	}
	props := []cdx.Property{
		{Name: "go:package", Value: info.Path},
		{Name: "go:version", Value: info.GoVersion},
		{Name: "vcs:commit", Value: src.Commit},
	}
	for _, s := range info.Settings {
		props = append(props, cdx.Property{Name: "go:build:" + s.Key, Value: s.Value})
	}
	main.Properties = &props

	stdlib := cdx.Component{
		BOMRef: purl("stdlib", info.GoVersion), Type: cdx.ComponentTypeLibrary, Name: "stdlib",
		Version: info.GoVersion, PackageURL: purl("stdlib", info.GoVersion),
		Description: "the Go standard library",
	}
	components := []cdx.Component{stdlib}
	for _, dep := range info.Deps {
		mod := dep
		if dep.Replace != nil {
			mod = dep.Replace
		}
		if mod.Version == "" {
			return nil, fmt.Errorf("module %s: the build information records no version (a replacement by a local folder?)", mod.Path)
		}
		c := cdx.Component{
			BOMRef: purl(mod.Path, mod.Version), Type: cdx.ComponentTypeLibrary, Name: mod.Path,
			Version: mod.Version, PackageURL: purl(mod.Path, mod.Version), Scope: cdx.ScopeRequired,
		}
		var p []cdx.Property
		if mod.Sum != "" {
			// The go.sum hash of the module's files (h1:), which `go mod verify` checks.
			p = append(p, cdx.Property{Name: "go:module:sum", Value: mod.Sum})
		}
		if dep.Replace != nil {
			p = append(p, cdx.Property{Name: "go:module:replaces", Value: dep.Path + "@" + dep.Version})
		}
		if len(p) > 0 {
			c.Properties = &p
		}
		components = append(components, c)
	}
	slices.SortFunc(components, func(a, b cdx.Component) int { return strings.Compare(a.BOMRef, b.BOMRef) })
	refs := make([]string, 0, len(components))
	for _, c := range components {
		refs = append(refs, c.BOMRef)
	}

	bom := cdx.NewBOM()
	bom.SerialNumber = serial(sum)
	bom.Metadata = &cdx.Metadata{
		Timestamp: src.Time.UTC().Format(time.RFC3339),
		Tools: &cdx.ToolsChoice{Components: &[]cdx.Component{{
			Type: cdx.ComponentTypeApplication, Name: "hack/release", Version: src.Version,
			Description: "volume-healer's release build: the SBOM from the binary's Go build information",
		}}},
		Component: &main,
	}
	bom.Components = &components
	bom.Dependencies = &[]cdx.Dependency{{Ref: mainRef, Dependencies: &refs}}
	return bom, nil
}

// serial is the SBOM's serial number, derived from the binary's SHA-256 so that the same binary
// gives the same SBOM: a UUID (version 8, custom) of its first 16 bytes.
func serial(sum [32]byte) string {
	u := sum[:16]
	u[6] = u[6]&0x0f | 0x80
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf("urn:uuid:%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}
