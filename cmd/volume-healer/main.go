// Command volume-healer is the controller: it watches for node plugin restarts and periodic
// schedules, asks the policy what to do with each affected volume, and probes and heals volumes
// through the healer sidecars.
//
// It parses the configuration and hands over to package controller; it must not import test/.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/cmd/volume-healer/controller"
	"github.com/volume-healer/volume-healer/config"
	"github.com/volume-healer/volume-healer/logging"
	"github.com/volume-healer/volume-healer/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newCommand(os.LookupEnv).ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "volume-healer:", err)
		os.Exit(1)
	}
}

func newCommand(env func(string) (string, bool)) *cobra.Command {
	// The configuration's flags live on their own set: controller-runtime registers --kubeconfig on
	// Go's global flag set, and the configuration owns that key.
	flags := pflag.NewFlagSet("volume-healer", pflag.ContinueOnError)
	config.RegisterFlags(flags)
	// The logging flags of every Kubernetes component (-v, --vmodule, --logging-format); -v and
	// --logging-format win over the configuration's log.verbosity and log.format.
	logFlags := pflag.NewFlagSet("logging", pflag.ContinueOnError)
	logOpts := logging.NewOptions()
	logOpts.AddFlags(logFlags)

	load := func() (*config.Config, error) { return config.Load(flags, env) }
	root := &cobra.Command{
		Use:   "volume-healer",
		Short: "Keep CSI volumes usable after node plugin restarts: probe and heal them through the healer sidecars",
		Long: "volume-healer runs restart-triggered and periodic sweeps of CSI volumes, asks a Rego policy\n" +
			"whether to probe, heal or skip each volume, and sends the calls to the healer sidecar in the\n" +
			"node plugin pod under concurrency budgets.\n\n" +
			"Configuration comes from built-in defaults, a YAML file (--config), VOLUME_HEALER_* environment\n" +
			"variables and flags, each overriding the one before; see docs/configuration.md.",
		Version:       version.Get().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := load()
			if err != nil {
				return err
			}
			logOpts.Default(cfg.Log.Verbosity, cfg.Log.Format)
			if err := logOpts.Apply(cmd.OutOrStdout(), cmd.ErrOrStderr()); err != nil {
				return err
			}
			defer klog.Flush()
			klog.Background().Info("Starting", "version", version.Get().String())
			return controller.Run(cmd.Context(), cfg)
		},
	}
	root.PersistentFlags().AddFlagSet(flags)
	root.Flags().AddFlagSet(logFlags)
	root.SetVersionTemplate("{{.Name}} {{.Version}}\n")

	configCmd := &cobra.Command{Use: "config", Short: "Inspect the configuration"}
	configCmd.AddCommand(&cobra.Command{
		Use:   "print",
		Short: "Print the effective configuration (defaults, file, environment and flags merged) as YAML",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := load()
			if err != nil {
				return err
			}
			out, err := cfg.YAML()
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	})
	root.AddCommand(configCmd)
	return root
}
