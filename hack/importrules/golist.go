package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
)

// listed is what go list -json tells of one package build.
type listed struct {
	ImportPath string
	Name       string
	ForTest    string
	Imports    []string
	Module     *struct {
		Path string
		Main bool
	}
	Error *struct{ Err string }
}

// goList runs the go command in dir with env (nil: the process's) and returns its standard output;
// a failure carries its standard error.
func goList(dir string, env []string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go %s in %s: %w\n%s", strings.Join(args, " "), dir, err, stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// loadGraph lists patterns in dir with every package they link, and with tests the builds of their
// tests, and returns the main module's path and the graph.
func loadGraph(dir string, env []string, tests bool, patterns ...string) (string, []Package, error) {
	args := []string{"list", "-deps", "-json=ImportPath,Name,ForTest,Imports,Module,Error"}
	if tests {
		args = append(args, "-test")
	}
	out, err := goList(dir, env, append(args, patterns...)...)
	if err != nil {
		return "", nil, err
	}
	return decodeGraph(bytes.NewReader(out))
}

// decodeGraph reads the output of go list -deps -json [-test].
func decodeGraph(r io.Reader) (string, []Package, error) {
	var module string
	var pkgs []Package
	dec := json.NewDecoder(r)
	for {
		var l listed
		if err := dec.Decode(&l); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return "", nil, fmt.Errorf("reading go list's output: %w", err)
		}
		if l.Error != nil {
			return "", nil, fmt.Errorf("go list: %s: %s", l.ImportPath, l.Error.Err)
		}
		p := Package{ID: l.ImportPath, Imports: l.Imports}
		p.Path, _, _ = strings.Cut(l.ImportPath, " ")
		if l.Module != nil {
			p.Module = l.Module.Path
			if l.Module.Main {
				module = l.Module.Path
			}
		}
		switch {
		case l.ForTest == "" && l.Name == "main" && strings.HasSuffix(l.ImportPath, ".test"):
			// The main that go test generates: no rule binds it.
		case l.ForTest == "":
			p.Of = p.Path
		case p.Path == l.ForTest || p.Path == l.ForTest+"_test":
			p.Of, p.Test = l.ForTest, true
		default:
			// Another package rebuilt against the test build of ForTest: its own build is the
			// one its rules bind.
		}
		pkgs = append(pkgs, p)
	}
	if module == "" {
		return "", nil, errors.New("go list named no package of the main module")
	}
	return module, pkgs, nil
}
