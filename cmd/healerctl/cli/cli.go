// Package cli is healerctl, the operator's and driver author's tool for volume-healer: it shows
// what the healer is doing in a cluster (status), tests, evaluates and explains policies (policy),
// checks a driver against the healer protocol (sanity), and requests sweeps (sweep).
//
// It owns the command tree, its flags and what each command prints; cmd/healerctl only hands it
// the process's name, arguments and signals. Installed under the name kubectl-healer, healerctl is
// a kubectl plugin: `kubectl healer status`; the commands that reach a cluster take kubectl's own
// flags (-n, --context, --as, --kubeconfig, ...) from k8s.io/cli-runtime, and cobra's completion
// command writes the shells' completion scripts.
//
// It must not import test/ (what it runs ships with it) nor the controller's packages under
// cmd/volume-healer.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/volume-healer/volume-healer/version"
)

// pluginName is the binary's name as a kubectl plugin: kubectl runs it for `kubectl healer`.
const pluginName = "kubectl-healer"

// Run runs healerctl with args, the command line without the binary's name, and returns the
// process's exit code: 0, exitNeedsHuman when status found something that needs a human, 1 on any
// other error, which it writes to stderr. invokedAs is the binary's name, which makes the help say
// `kubectl healer` when kubectl runs it as a plugin.
func Run(ctx context.Context, invokedAs string, args []string, stderr io.Writer) int {
	root := newRootCommand(invokedAs)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "healerctl:", err)
	var exit *exitError
	if errors.As(err, &exit) {
		return exit.code
	}
	return 1
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
