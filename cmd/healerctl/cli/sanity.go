package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/volume-healer/volume-healer/api/healer/sanity"
)

func newSanityCommand() *cobra.Command {
	var (
		opts    sanity.Options
		control string
	)
	cmd := &cobra.Command{
		Use:   "sanity --endpoint unix:///path/to/csi-addons.sock",
		Short: "Check a driver's Healer service against the volume-healer protocol, and say which tier the driver gets",
		Long: `Runs the promises of the volume-healer protocol against a driver's CSI-Addons socket and
prints one line per check (PASS, FAIL or SKIP). Exits 0 only when no check failed.

Checks that need a broken volume (heal repairs it, a lost volume stays lost, a busy volume
answers ABORTED) break the volume through --control: a socket that serves the control
endpoint of package api/healer/sanity (PUT /volumes/{id}/condition and /staged), as the
reference driver's control socket does in both modes. Without --control they are SKIPPED: the run can pass without having verified them,
and the summary lists them.

The summary starts with the tier the driver gets, from its answer to GetHealerCapabilities:
healer (it serves HEAL: volumes are healed in place), probe-only (it serves PROBE and no HEAL),
or none (it serves no Healer service: the healer sidecar probes its volumes itself). A driver
that serves no Healer service is not a failure: the protocol's checks are skipped.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Out = cmd.OutOrStdout()
			if control != "" {
				c, err := sanity.NewHTTPControl(control)
				if err != nil {
					return fmt.Errorf("--control: %w", err)
				}
				opts.Control = c
			}
			report, err := sanity.Run(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if !report.Passed() {
				return fmt.Errorf("%d of %d checks failed", report.Count(sanity.Fail), len(report.Results))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Endpoint, "endpoint", "", "the driver's CSI-Addons socket, unix:///path (required)")
	f.StringVar(&opts.VolumeID, "volume", "", "volume to probe, heal and break; staged and healthy (default: the first one ListStagedVolumes returns)")
	f.StringVar(&opts.UnknownVolumeID, "unknown-volume", "", "a volume ID the driver must answer NOT_FOUND for (default \"volume-healer-sanity-no-such-volume\")")
	f.StringVar(&control, "control", "", "a control endpoint (the reference driver's control socket), unix:///path, to break volumes on purpose (default: none, those checks are skipped)")
	f.DurationVar(&opts.CallTimeout, "timeout", 10*time.Second, "deadline of each call to the driver")
	f.DurationVar(&opts.HangFor, "hang-for", 2*time.Second, "how long the hung volume holds a call in flight in the ABORTED check (with --control)")
	_ = cmd.MarkFlagRequired("endpoint")
	return cmd
}
