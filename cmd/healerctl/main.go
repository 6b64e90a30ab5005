// Command healerctl is the operator's and driver author's tool for volume-healer: it shows what
// the healer is doing in a cluster, tests and evaluates policies, checks a driver against the
// healer protocol, and requests sweeps.
//
// Installed under the name kubectl-healer it is a kubectl plugin: `kubectl healer status`.
//
// It must not import test/: what it runs ships with it.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/volume-healer/volume-healer/version"
)

// pluginName is the binary's name as a kubectl plugin: kubectl runs it for `kubectl healer`.
const pluginName = "kubectl-healer"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := newRootCommand(filepath.Base(os.Args[0])).ExecuteContext(ctx)
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "healerctl:", err)
	var exit *exitError
	if errors.As(err, &exit) {
		os.Exit(exit.code)
	}
	os.Exit(1)
}

// exitError ends healerctl with code rather than 1.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// newRootCommand returns the command tree; invokedAs is the binary's name, which makes the help
// say `kubectl healer` when kubectl runs it as a plugin.
func newRootCommand(invokedAs string) *cobra.Command {
	root := &cobra.Command{
		Use:           "healerctl",
		Short:         "Operate volume-healer: status, policies, driver conformance, sweeps",
		Version:       version.Get().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	if invokedAs == pluginName {
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl healer"}
	}
	root.SetVersionTemplate("healerctl {{.Version}}\n")
	root.AddCommand(newStatusCommand(), newPolicyCommand(), newSanityCommand(), newSweepCommand())
	return root
}
