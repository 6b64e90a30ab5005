// Command healerctl is the operator's and driver author's tool for volume-healer: it shows what
// the healer is doing in a cluster, tests and evaluates policies, checks a driver against the
// healer protocol, and requests sweeps. The commands live in cmd/healerctl/cli.
//
// Installed under the name kubectl-healer it is a kubectl plugin: `kubectl healer status`.
//
// It must not import test/: what it runs ships with it; nor a driver's packages (refdriver/,
// driverkit): `healerctl sanity` reaches a driver through its sockets only. main_test.go checks
// both.
package main

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/volume-healer/volume-healer/cmd/healerctl/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, filepath.Base(os.Args[0]), os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}
