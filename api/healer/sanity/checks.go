package sanity

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/csi-addons/spec/lib/go/identity"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// Check names, as they appear in the report, and the promise each one verifies.
const (
	// CheckIdentity: GetIdentity answers with a name and a vendor version, Probe says ready.
	CheckIdentity = "identity"
	// CheckIdentityAdvertises: Identity lists NODE_SERVICE and the manifest names the Healer
	// protocol version.
	CheckIdentityAdvertises = "identity-advertises-healer"
	// CheckCapabilities: GetHealerCapabilities answers, advertises PROBE, and lists only
	// defined RPCs and VolumeKeeping types, each once.
	CheckCapabilities = "healer-capabilities"
	// CheckProbeEmptyVolumeID: ProbeVolume without volume_id is INVALID_ARGUMENT.
	CheckProbeEmptyVolumeID = "probe-empty-volume-id"
	// CheckProbeUnknownVolume: ProbeVolume of an unknown volume is NOT_FOUND.
	CheckProbeUnknownVolume = "probe-unknown-volume"
	// CheckHealEmptyVolumeID: HealVolume without volume_id is INVALID_ARGUMENT.
	CheckHealEmptyVolumeID = "heal-empty-volume-id"
	// CheckHealUnknownVolume: HealVolume of an unknown volume is NOT_FOUND.
	CheckHealUnknownVolume = "heal-unknown-volume"
	// CheckVolumeUnderTest fails when no volume to test was given or listed.
	CheckVolumeUnderTest = "volume-under-test"
	// CheckControl fails when the given control cannot stage and restore the volume.
	CheckControl = "control"
	// CheckProbeHealthyVolume: ProbeVolume of a healthy volume is OK with empty health.
	CheckProbeHealthyVolume = "probe-healthy-volume"
	// CheckWrongStagingPath: ProbeVolume with a staging path the volume is not staged at is
	// FAILED_PRECONDITION.
	CheckWrongStagingPath = "wrong-staging-path"
	// CheckRPCsMatchCapabilities: advertised RPCs are served, the others are UNIMPLEMENTED.
	CheckRPCsMatchCapabilities = "rpcs-match-capabilities"
	// CheckHealHealthyVolume: HealVolume of a healthy volume is OK with empty health (or
	// FAILED_PRECONDITION when the volume is not healable).
	CheckHealHealthyVolume = "heal-healthy-volume"
	// CheckProbeBrokenVolume: a gone, read-only or lost volume probes as INACCESSIBLE, DEGRADED
	// or DATA_LOSS.
	CheckProbeBrokenVolume = "probe-broken-volume"
	// CheckHealBrokenVolume: HealVolume of a gone or read-only volume answers empty health and
	// the next probe agrees.
	CheckHealBrokenVolume = "heal-broken-volume"
	// CheckHealDataLoss: HealVolume of a lost volume is OK and still reports DATA_LOSS, or, when
	// the probe says the volume is not healable, is refused with FAILED_PRECONDITION.
	CheckHealDataLoss = "heal-data-loss"
	// CheckNotStagedVolume: calls on a volume not staged on the node are FAILED_PRECONDITION,
	// and ListStagedVolumes leaves it out.
	CheckNotStagedVolume = "not-staged-volume"
	// CheckConcurrentCallsAborted: a call on a volume with a call in flight is ABORTED.
	CheckConcurrentCallsAborted = "concurrent-calls-aborted"
	// CheckListStagedVolumes: ListStagedVolumes pages consistently and rejects a negative
	// max_entries with INVALID_ARGUMENT.
	CheckListStagedVolumes = "list-staged-volumes"
	// CheckVolumeKeeping: a driver that advertises no VolumeKeeping capability never probes a
	// volume as kept; one that does probes its healthy kept volume under test healthy and kept.
	CheckVolumeKeeping = "volume-keeping"
	// CheckHealthVocabulary: every health entry of the run has a defined status and a CamelCase
	// reason, and no (status, reason) repeats within an answer.
	CheckHealthVocabulary = "health-vocabulary"
	// CheckRestoreVolume fails when the control cannot restore the volume after the run.
	CheckRestoreVolume = "restore-volume"
)

const (
	// noSuchStagingPath is a staging path no driver stages a volume at.
	noSuchStagingPath = "/volume-healer-sanity/no-such-staging-path/globalmount"
	// maxListPages bounds a listing, so that a driver whose tokens never end cannot hang the run.
	maxListPages = 10000
	// Without a control, this many probes race this many times in the hope of an overlap.
	racingCalls, racingRounds = 16, 3

	controlFailedDetailPrefix    = "the control could not "
	notHealableSkipDetailPattern = "volume %q is not healable (its probe said healable=false); pass a healable volume to check heals"
)

// runner holds what the checks learn about the driver as the run goes.
type runner struct {
	opts     Options
	identity identity.IdentityClient
	healer   healerv1alpha1.HealerClient
	control  VolumeControl

	caps     []*healerv1alpha1.HealerCapability
	manifest map[string]string
	// capsResp and capsErr are the driver's answer to GetHealerCapabilities, asked once.
	capsResp *healerv1alpha1.GetHealerCapabilitiesResponse
	capsErr  error
	volume   string
	// healable is what the probe of the healthy volume said; healableKnown is false when that
	// probe failed.
	healable, healableKnown bool
	// healthyKept is what the probe of the healthy volume said of kept; known with
	// healableKnown. keptAnswers counts the probe answers of the run that said kept.
	healthyKept bool
	keptAnswers int

	// Every health list the driver returned is checked against the vocabulary here.
	mu             sync.Mutex
	healthEntries  int
	healthAnswers  int
	healthProblems []string

	report Report
}

func (r *runner) record(check string, o Outcome, format string, args ...any) {
	res := Result{Check: check, Outcome: o, Detail: fmt.Sprintf(format, args...)}
	r.report.Results = append(r.report.Results, res)
	fmt.Fprintln(r.opts.Out, res.String())
}

func (r *runner) run(ctx context.Context) {
	if !r.checkIdentity(ctx) {
		return
	}
	r.askCapabilities(ctx)
	r.checkIdentityAdvertisesHealer(ctx)
	if !r.checkCapabilities(ctx) {
		return
	}
	r.checkProbeEmptyVolumeID(ctx)
	r.checkProbeUnknownVolume(ctx)
	r.checkHealEmptyVolumeID(ctx)
	r.checkHealUnknownVolume(ctx)
	if !r.chooseVolume(ctx) {
		r.checkHealthVocabulary()
		return
	}
	if r.control != nil {
		r.prepareVolume(ctx)
		defer r.restoreVolume(ctx)
	}
	r.checkProbeHealthyVolume(ctx)
	r.checkWrongStagingPath(ctx)
	r.checkRPCsMatchCapabilities(ctx)
	r.checkHealHealthyVolume(ctx)
	r.checkProbeBrokenVolume(ctx)
	r.checkHealBrokenVolume(ctx)
	r.checkHealDataLoss(ctx)
	r.checkNotStagedVolume(ctx)
	r.checkConcurrentCallsAborted(ctx)
	r.checkListStagedVolumes(ctx)
	r.checkVolumeKeeping()
	r.checkHealthVocabulary()
}

// --- identity and capabilities ---

func (r *runner) checkIdentity(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	id, err := r.identity.GetIdentity(cctx, &identity.GetIdentityRequest{})
	if err != nil {
		r.record(CheckIdentity, Fail, "GetIdentity on %s: %s; nothing else can be checked", r.opts.Endpoint, describeErr(err))
		return false
	}
	var problems []string
	if id.GetName() == "" {
		problems = append(problems, "name is empty")
	} else if len(id.GetName()) > 63 {
		problems = append(problems, fmt.Sprintf("name %q is longer than 63 characters", id.GetName()))
	}
	if id.GetVendorVersion() == "" {
		problems = append(problems, "vendor_version is empty")
	}
	probe, err := r.identity.Probe(cctx, &identity.ProbeRequest{})
	switch {
	case err != nil:
		problems = append(problems, "Probe: "+describeErr(err))
	case probe.GetReady() != nil && !probe.GetReady().GetValue():
		problems = append(problems, "Probe says the driver is not ready")
	}
	if len(problems) > 0 {
		r.record(CheckIdentity, Fail, "%s", strings.Join(problems, "; "))
		return false
	}
	r.manifest = id.GetManifest()
	r.record(CheckIdentity, Pass, "driver %s %s answers GetIdentity and Probe", id.GetName(), id.GetVendorVersion())
	return true
}

// askCapabilities asks the driver for its Healer capabilities once: whether it serves the
// Healer service at all decides what the identity must announce and which checks apply.
func (r *runner) askCapabilities(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	r.capsResp, r.capsErr = r.healer.GetHealerCapabilities(cctx, &healerv1alpha1.GetHealerCapabilitiesRequest{})
}

// servesNoHealer reports whether the driver answered GetHealerCapabilities with UNIMPLEMENTED:
// it serves no Healer service, as a driver that has not adopted the protocol.
func (r *runner) servesNoHealer() bool {
	return status.Code(r.capsErr) == codes.Unimplemented
}

func (r *runner) checkIdentityAdvertisesHealer(ctx context.Context) {
	if r.servesNoHealer() {
		if got, ok := r.manifest[healerv1alpha1.IdentityManifestKey]; ok {
			r.record(CheckIdentityAdvertises, Fail, "the GetIdentity manifest has %s=%q, yet GetHealerCapabilities answers UNIMPLEMENTED: announce the protocol only when the Healer service is registered",
				healerv1alpha1.IdentityManifestKey, got)
			return
		}
		r.record(CheckIdentityAdvertises, Skip, "the driver serves no Healer service, and its identity announces none")
		return
	}
	cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	caps, err := r.identity.GetCapabilities(cctx, &identity.GetCapabilitiesRequest{})
	if err != nil {
		r.record(CheckIdentityAdvertises, Fail, "GetCapabilities: %s", describeErr(err))
		return
	}
	var problems []string
	node := false
	for _, c := range caps.GetCapabilities() {
		if c.GetService().GetType() == identity.Capability_Service_NODE_SERVICE {
			node = true
		}
	}
	if !node {
		problems = append(problems, "GetCapabilities does not list the NODE_SERVICE service")
	}
	if got := r.manifest[healerv1alpha1.IdentityManifestKey]; got != healerv1alpha1.Version {
		problems = append(problems, fmt.Sprintf("the GetIdentity manifest has %s=%q, want %q",
			healerv1alpha1.IdentityManifestKey, got, healerv1alpha1.Version))
	}
	if len(problems) > 0 {
		r.record(CheckIdentityAdvertises, Fail, "%s", strings.Join(problems, "; "))
		return
	}
	r.record(CheckIdentityAdvertises, Pass, "NODE_SERVICE and manifest %s=%s", healerv1alpha1.IdentityManifestKey, healerv1alpha1.Version)
}

func (r *runner) checkCapabilities(ctx context.Context) bool {
	resp, err := r.capsResp, r.capsErr
	if r.servesNoHealer() {
		// Not a failure: a driver that has not adopted the protocol is still helped, from the
		// sidecar's own probe. The protocol's checks do not apply to it.
		r.report.Tier = TierNone
		r.record(CheckCapabilities, Skip, "GetHealerCapabilities: %s: the driver serves no Healer service (tier %s): volume-healer's sidecar probes its volumes itself, and only remedies outside the driver are left; the protocol's checks do not apply",
			describeErr(err), TierNone)
		return false
	}
	if err != nil {
		r.record(CheckCapabilities, Fail, "GetHealerCapabilities: %s; nothing else can be checked", describeErr(err))
		return false
	}
	r.report.Tier = tierOf(resp.GetCapabilities())
	var problems, names []string
	seen := map[healerv1alpha1.HealerCapability_RPC_Type]bool{}
	keeps := map[healerv1alpha1.HealerCapability_VolumeKeeping_Type]bool{}
	for i, c := range resp.GetCapabilities() {
		if k := c.GetVolumeKeeping(); k != nil {
			switch t := k.GetType(); {
			case t == healerv1alpha1.HealerCapability_VolumeKeeping_UNKNOWN || healerv1alpha1.HealerCapability_VolumeKeeping_Type_name[int32(t)] == "":
				problems = append(problems, fmt.Sprintf("capability %d has volume keeping type %d, which v1alpha1 does not define", i, t))
			case keeps[t]:
				problems = append(problems, fmt.Sprintf("volume keeping %s is advertised twice", t))
			default:
				keeps[t] = true
				names = append(names, "VolumeKeeping "+t.String())
			}
			continue
		}
		t := c.GetRpc().GetType()
		switch {
		case c.GetRpc() == nil:
			problems = append(problems, fmt.Sprintf("capability %d sets neither rpc nor volume_keeping", i))
		case t == healerv1alpha1.HealerCapability_RPC_UNKNOWN || healerv1alpha1.HealerCapability_RPC_Type_name[int32(t)] == "":
			problems = append(problems, fmt.Sprintf("capability %d has type %d, which v1alpha1 does not define", i, t))
		case seen[t]:
			problems = append(problems, fmt.Sprintf("%s is advertised twice", t))
		default:
			names = append(names, t.String())
		}
		seen[t] = true
	}
	if !seen[healerv1alpha1.HealerCapability_RPC_PROBE] {
		problems = append(problems, "PROBE is not advertised; every driver must implement ProbeVolume")
	}
	for k := range resp.GetAttributes() {
		if k == "" {
			problems = append(problems, "an attribute has an empty key")
		}
	}
	// Later checks go by what was advertised, even when the list had problems.
	r.caps = resp.GetCapabilities()
	if len(problems) > 0 {
		r.record(CheckCapabilities, Fail, "%s", strings.Join(problems, "; "))
		return true
	}
	attrs := make([]string, 0, len(resp.GetAttributes()))
	for k, v := range resp.GetAttributes() {
		attrs = append(attrs, k+"="+v)
	}
	slices.Sort(attrs)
	r.record(CheckCapabilities, Pass, "advertises %s; attributes: %s", strings.Join(names, ", "), orNone(strings.Join(attrs, " ")))
	return true
}

func (r *runner) advertises(t healerv1alpha1.HealerCapability_RPC_Type) bool {
	return healerv1alpha1.HasRPC(r.caps, t)
}

// checkVolumeKeeping checks what the run's probes said of kept against the driver's VolumeKeeping
// capabilities: kept only from a driver that advertises keeping, and a kept volume that the run
// found healthy probed healthy.
func (r *runner) checkVolumeKeeping() {
	keeping := healerv1alpha1.VolumeKeepingOf(r.caps)
	r.mu.Lock()
	kept := r.keptAnswers
	r.mu.Unlock()
	if len(keeping) == 0 {
		if kept > 0 {
			r.record(CheckVolumeKeeping, Fail, "%d probe answer(s) said kept=true, but the driver advertises no VolumeKeeping capability; a driver that keeps no volume alive across restarts must answer kept=false", kept)
			return
		}
		r.record(CheckVolumeKeeping, Pass, "advertises no volume keeping, and no probe said kept")
		return
	}
	names := make([]string, 0, len(keeping))
	for _, t := range keeping {
		names = append(names, t.String())
	}
	switch {
	case !r.healableKnown:
		r.record(CheckVolumeKeeping, Skip, "advertises %s, but the probe of the healthy volume %q failed", strings.Join(names, ", "), r.volume)
	case !r.healthyKept:
		r.record(CheckVolumeKeeping, Skip, "advertises %s, but volume %q probes as not kept; pass a volume the driver keeps alive to check a kept volume's probe", strings.Join(names, ", "), r.volume)
	default:
		// A kept volume that was not healthy failed CheckProbeHealthyVolume already.
		r.record(CheckVolumeKeeping, Pass, "advertises %s; volume %q probes healthy and kept", strings.Join(names, ", "), r.volume)
	}
}

// --- argument checks that need no volume ---

func (r *runner) checkProbeEmptyVolumeID(ctx context.Context) {
	_, err := r.probe(ctx, "", "")
	r.expectCode(CheckProbeEmptyVolumeID, "ProbeVolume with an empty volume_id", err, codes.InvalidArgument)
}

func (r *runner) checkProbeUnknownVolume(ctx context.Context) {
	_, err := r.probe(ctx, r.opts.UnknownVolumeID, "")
	r.expectCode(CheckProbeUnknownVolume, fmt.Sprintf("ProbeVolume of unknown volume %q", r.opts.UnknownVolumeID), err, codes.NotFound)
}

func (r *runner) checkHealEmptyVolumeID(ctx context.Context) {
	if !r.advertises(healerv1alpha1.HealerCapability_RPC_HEAL) {
		r.record(CheckHealEmptyVolumeID, Skip, "the driver does not advertise HEAL")
		return
	}
	_, err := r.heal(ctx, "", "")
	r.expectCode(CheckHealEmptyVolumeID, "HealVolume with an empty volume_id", err, codes.InvalidArgument)
}

func (r *runner) checkHealUnknownVolume(ctx context.Context) {
	if !r.advertises(healerv1alpha1.HealerCapability_RPC_HEAL) {
		r.record(CheckHealUnknownVolume, Skip, "the driver does not advertise HEAL")
		return
	}
	_, err := r.heal(ctx, r.opts.UnknownVolumeID, "")
	r.expectCode(CheckHealUnknownVolume, fmt.Sprintf("HealVolume of unknown volume %q", r.opts.UnknownVolumeID), err, codes.NotFound)
}
