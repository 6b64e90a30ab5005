// Command importrules checks the import rules that volume-healer's packages state in their doc
// comments, and the promise that the public surface (api/ and driverkit/) costs a driver few
// modules. `make lint` runs it from the repository's root:
//
//	go run ./hack/importrules [-surface=false]
//
// The rules are one table (rules.go), each with its reason. A package binds a rule by its own
// files, or with the rule's Tests by its tests too; a rule holds for everything a package links,
// or with Direct for its own imports only. A violation names the importing package, the imported
// one, the chain of imports between them, and the rule; a pattern of the table that matches no
// package fails too, so that a moved package does not leave its rule checking nothing.
//
// The surface check writes a driver module in a temporary folder that imports every package under
// api/ and driverkit/, with a replace directive to this checkout, runs go mod tidy with GOPROXY=off
// (the module cache must hold the module's dependencies, as after any build of it) and builds it,
// then fails if its go.mod requires a module that surface.go does not allow.
//
// It imports nothing of volume-healer: it reads the module through the go command.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

func main() {
	surface := flag.Bool("surface", true, "also check the modules a driver needs to import api/ and driverkit/")
	flag.Parse()
	root, err := goList(".", nil, "env", "GOMOD")
	if err != nil {
		fmt.Fprintln(os.Stderr, "importrules:", err)
		os.Exit(2)
	}
	dir := strings.TrimSuffix(strings.TrimSpace(string(root)), "/go.mod")
	if dir == "" || dir == "/dev/null" {
		fmt.Fprintln(os.Stderr, "importrules: run it inside the module")
		os.Exit(2)
	}
	problems, err := run(dir, rules, *surface)
	if err != nil {
		fmt.Fprintln(os.Stderr, "importrules:", err)
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Println(p)
	}
	if len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "importrules: %d problem(s); the rules and their reasons are in hack/importrules/rules.go\n", len(problems))
		os.Exit(1)
	}
}

// run checks the module at dir against rules, and with surface its public surface, and returns
// every problem found, one line each.
func run(dir string, rules []Rule, surface bool) ([]string, error) {
	module, pkgs, err := loadGraph(dir, nil, true, "./...")
	if err != nil {
		return nil, err
	}
	problems := Unmatched(module, pkgs, rules)
	for _, v := range Check(module, pkgs, rules) {
		problems = append(problems, v.String(module))
	}
	if surface {
		more, err := checkSurface(dir, module)
		if err != nil {
			return nil, fmt.Errorf("the driver module: %w", err)
		}
		problems = append(problems, more...)
	}
	return problems, nil
}
