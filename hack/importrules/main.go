// Command importrules checks the import rules that volume-healer's packages state in their doc
// comments. `make lint` runs it from the repository's root:
//
//	go run ./hack/importrules
//
// The rules are one table (rules.go), each with its reason. A package binds a rule by its own
// files, or with the rule's Tests by its tests too; a rule holds for everything a package links,
// or with Direct for its own imports only. A violation names the importing package, the imported
// one, the chain of imports between them, and the rule; a pattern of the table that matches no
// package fails too, so that a moved package does not leave its rule checking nothing.
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
	problems, err := run(dir, rules)
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

// run checks the module at dir against rules and returns every problem found, one line each.
func run(dir string, rules []Rule) ([]string, error) {
	module, pkgs, err := loadGraph(dir, nil, true, "./...")
	if err != nil {
		return nil, err
	}
	problems := Unmatched(module, pkgs, rules)
	for _, v := range Check(module, pkgs, rules) {
		problems = append(problems, v.String(module))
	}
	return problems, nil
}
