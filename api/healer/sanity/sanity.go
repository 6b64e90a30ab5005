// Package sanity checks a driver's Healer service against the promises of the volume-healer
// protocol (docs/protocol.md), the way csi-sanity checks a CSI driver. It talks to the driver's
// CSI-Addons socket like the sidecar does, runs one check after another, and reports each as
// PASS, FAIL or SKIP. `healerctl sanity` is its command line.
//
// Some promises can only be verified on a broken volume (a heal repairs it; a lost volume stays
// lost). Breaking a volume on purpose is not part of the protocol, so the caller supplies a
// VolumeControl for it; without one, those checks are skipped, and the report says so.
// HTTPControl is the VolumeControl of a driver in another process that serves the control
// endpoint (control.go), a small HTTP protocol any driver's test build can serve.
//
// It speaks only the wire protocol (api/healer/v1alpha1): like all of api/ it links no package of
// volume-healer outside api/ and driverkit/ (the controller's, the sidecar's, test/) and no
// Kubernetes client, so that a driver author can run it against any driver.
package sanity

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/csi-addons/spec/lib/go/identity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// Fault is a condition a VolumeControl can put a volume in. Each fault except Healthy is
// expected to show in a probe with a specific health status.
type Fault string

const (
	// Healthy restores a volume.
	Healthy Fault = "healthy"
	// Gone: the mount vanished. A probe must report INACCESSIBLE; a heal must repair it.
	Gone Fault = "gone"
	// ReadOnly: the mount turned read-only. A probe must report DEGRADED; a heal must repair it.
	ReadOnly Fault = "readonly"
	// Hung: calls that touch the mount block for the given duration. Used to hold a call in
	// flight while a second one arrives.
	Hung Fault = "hung"
	// Lost: the data is gone. A probe must report DATA_LOSS; a heal runs but cannot repair it.
	Lost Fault = "lost"
)

// VolumeControl breaks and restores volumes of the driver under test. HTTPControl provides it
// over the control endpoint; a test that runs the driver in its own process may provide it
// through the driver's Go API.
type VolumeControl interface {
	// SetFault puts the volume in fault f; hang is how long calls block for Hung.
	SetFault(ctx context.Context, volumeID string, f Fault, hang time.Duration) error
	// SetStaged marks the volume as staged or not staged on the driver's node.
	SetStaged(ctx context.Context, volumeID string, staged bool) error
}

// Options configure a run. Zero values take the defaults documented on each field.
type Options struct {
	// Endpoint is the driver's CSI-Addons socket, "unix:///path" (a bare absolute path works
	// too). Required.
	Endpoint string

	// VolumeID is the volume the checks probe, heal and break. It must be staged on the driver's
	// node and healthy when the run starts (with Control, the run makes it so). Default: the
	// first volume ListStagedVolumes returns.
	VolumeID string

	// UnknownVolumeID is a volume ID the driver must answer NOT_FOUND for. Drivers that parse
	// their volume IDs should be given a well-formed ID of a volume that does not exist.
	// Default: "volume-healer-sanity-no-such-volume".
	UnknownVolumeID string

	// Control breaks and restores VolumeID. Default: none; the checks that need a broken volume
	// are skipped.
	Control VolumeControl

	// CallTimeout is the deadline of each call to the driver. Default: 10s.
	CallTimeout time.Duration

	// HangFor is how long the hung volume blocks in the ABORTED check (with Control only).
	// Default: 2s.
	HangFor time.Duration

	// Out receives one line per check as it finishes, then a summary. Default: discarded.
	Out io.Writer
}

func (o *Options) setDefaults() error {
	switch {
	case o.Endpoint == "":
		return fmt.Errorf("%w: an endpoint is required (unix:///path/to/csi-addons.sock)", ErrInvalidOptions)
	case strings.HasPrefix(o.Endpoint, "/"):
		o.Endpoint = "unix://" + o.Endpoint
	case !strings.HasPrefix(o.Endpoint, "unix://"):
		return fmt.Errorf("%w: endpoint %q must look like unix:///path/to/csi-addons.sock", ErrInvalidOptions, o.Endpoint)
	}
	if o.UnknownVolumeID == "" {
		o.UnknownVolumeID = "volume-healer-sanity-no-such-volume"
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = 10 * time.Second
	}
	if o.HangFor == 0 {
		o.HangFor = 2 * time.Second
	}
	if o.CallTimeout < 0 || o.HangFor < 0 {
		return fmt.Errorf("%w: CallTimeout and HangFor must not be negative", ErrInvalidOptions)
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	return nil
}

// Outcome is the verdict of one check.
type Outcome string

const (
	// Pass: the driver kept the promise.
	Pass Outcome = "PASS"
	// Fail: the driver broke the promise; Detail says how.
	Fail Outcome = "FAIL"
	// Skip: the check could not run (no control, capability not advertised, ...); Detail says
	// why. A skipped check verified nothing.
	Skip Outcome = "SKIP"
)

// Result is the outcome of one check.
type Result struct {
	// Check names the check, for example "probe-unknown-volume".
	Check string
	// Outcome is PASS, FAIL or SKIP.
	Outcome Outcome
	// Detail explains the outcome.
	Detail string
}

// String formats the result as the command prints it: "PASS name: detail".
func (r Result) String() string {
	return fmt.Sprintf("%s %s: %s", r.Outcome, r.Check, r.Detail)
}

// Report holds the results of a run in the order the checks ran.
type Report struct {
	// Results has one entry per check.
	Results []Result
	// Tier is what volume-healer gets from the driver, from its answer to GetHealerCapabilities
	// (TierNone when it serves no Healer service); empty when the run could not tell (the
	// driver's identity or capabilities could not be read).
	Tier Tier
}

// Passed reports whether no check failed. Skipped checks do not fail a run.
func (r Report) Passed() bool {
	return r.Count(Fail) == 0
}

// Count returns how many checks had outcome o.
func (r Report) Count(o Outcome) int {
	n := 0
	for _, res := range r.Results {
		if res.Outcome == o {
			n++
		}
	}
	return n
}

// Result returns the result of the named check, if it ran.
func (r Report) Result(check string) (Result, bool) {
	for _, res := range r.Results {
		if res.Check == check {
			return res, true
		}
	}
	return Result{}, false
}

// WriteSummary writes the driver's tier, the totals and, when checks were skipped, a warning that names them:
// a run with skipped checks passes but has not verified everything.
func (r Report) WriteSummary(w io.Writer) {
	if r.Tier != "" {
		fmt.Fprintf(w, "TIER %s: %s\n", r.Tier, r.Tier.Describe())
	}
	fmt.Fprintf(w, "%d passed, %d failed, %d skipped\n", r.Count(Pass), r.Count(Fail), r.Count(Skip))
	if n := r.Count(Skip); n > 0 {
		fmt.Fprintf(w, "WARNING: %d check(s) were SKIPPED and verified nothing:\n", n)
		for _, res := range r.Results {
			if res.Outcome == Skip {
				fmt.Fprintf(w, "  - %s: %s\n", res.Check, res.Detail)
			}
		}
	}
}

// Run runs every check against the driver at opts.Endpoint, writing each result to opts.Out
// as it finishes and the summary at the end. The error reports unusable options only: a driver
// that cannot be reached fails the first check.
func Run(ctx context.Context, opts Options) (Report, error) {
	if err := opts.setDefaults(); err != nil {
		return Report{}, err
	}
	conn, err := grpc.NewClient(opts.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return Report{}, fmt.Errorf("%w: endpoint %q: %w", ErrInvalidOptions, opts.Endpoint, err)
	}
	defer func() { _ = conn.Close() }()

	r := &runner{
		opts:     opts,
		identity: identity.NewIdentityClient(conn),
		healer:   healerv1alpha1.NewHealerClient(conn),
		control:  opts.Control,
	}
	r.run(ctx)
	r.report.WriteSummary(opts.Out)
	return r.report, nil
}
