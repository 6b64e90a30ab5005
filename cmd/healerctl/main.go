// Command healerctl is the operator's and driver author's tool for volume-healer: it tests and
// evaluates policies, checks a driver against the healer protocol, and requests sweeps.
//
// It must not import test/: what it runs ships with it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "healerctl:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "healerctl",
		Short:         "Operate volume-healer: policies, driver conformance, sweeps",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newPolicyCommand(), newSanityCommand(), newSweepCommand())
	return root
}
