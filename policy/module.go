package policy

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Module is one Rego source file of a policy set.
type Module struct {
	// File names the module in errors: a path on disk, or namespace/configmap/key for a module
	// delivered in a ConfigMap. Unique within a policy set.
	File string
	// Text is the Rego source.
	Text string
}

// builtinFS holds the built-in policy: default.rego (package volumehealer.builtin), decision.rego
// (package volumehealer, which serves the built-in decision) and their tests.
//
//go:embed default/*.rego
var builtinFS embed.FS

const (
	// builtinLibraryFile is the built-in library, added to every policy set that does not define
	// package volumehealer.builtin itself.
	builtinLibraryFile = "default/default.rego"
	// builtinEntryFile routes data.volumehealer.decision to the built-in decision.
	builtinEntryFile = "default/decision.rego"
	// builtinPrefix names the built-in modules in errors and traces.
	builtinPrefix = "builtin:"
)

// DefaultModules returns the built-in policy that serves when no policy ConfigMap exists.
func DefaultModules() []Module {
	return []Module{builtinModule(builtinEntryFile), builtinModule(builtinLibraryFile)}
}

// DefaultTestModules returns the built-in policy together with its Rego unit tests.
func DefaultTestModules() []Module {
	entries, err := fs.ReadDir(builtinFS, "default")
	if err != nil {
		panic(fmt.Sprintf("embedded default policy: %v", err)) // the embed pattern guarantees the folder
	}
	var mods []Module
	for _, e := range entries {
		mods = append(mods, builtinModule(path.Join("default", e.Name())))
	}
	return mods
}

func builtinModule(name string) Module {
	b, err := builtinFS.ReadFile(name)
	if err != nil {
		panic(fmt.Sprintf("embedded default policy: %v", err)) // the embed pattern guarantees the file
	}
	return Module{File: builtinPrefix + name, Text: string(b)}
}

// LoadFiles reads the Rego modules at paths: each path is a .rego file or a folder, searched
// recursively for .rego files. Files are returned in a stable order. This is the loader behind
// `healerctl policy test` and `eval`; ConfigMaps go through ModulesFromConfigMaps.
func LoadFiles(paths ...string) ([]Module, error) {
	var mods []Module
	seen := map[string]bool{}
	add := func(file string) error {
		if seen[file] {
			return nil
		}
		seen[file] = true
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("reading policy: %w", err)
		}
		mods = append(mods, Module{File: file, Text: string(b)})
		return nil
	}
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("reading policy: %w", err)
		}
		if !info.IsDir() {
			if err := add(filepath.Clean(p)); err != nil {
				return nil, err
			}
			continue
		}
		var files []string
		err = filepath.WalkDir(p, func(file string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(d.Name(), ".rego") {
				files = append(files, file)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("reading policy folder %s: %w", p, err)
		}
		slices.Sort(files)
		for _, f := range files {
			if err := add(f); err != nil {
				return nil, err
			}
		}
	}
	if len(mods) == 0 {
		return nil, fmt.Errorf("%w in %s", ErrNoModules, strings.Join(paths, ", "))
	}
	return mods, nil
}
