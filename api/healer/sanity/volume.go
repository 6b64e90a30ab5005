package sanity

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// --- the volume under test ---

func (r *runner) chooseVolume(ctx context.Context) bool {
	if r.opts.VolumeID != "" {
		r.volume = r.opts.VolumeID
		fmt.Fprintf(r.opts.Out, "using volume %q (given)\n", r.volume)
		return true
	}
	if !r.advertises(healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES) {
		r.record(CheckVolumeUnderTest, Fail, "no volume given and the driver does not advertise LIST_VOLUMES to find one: pass a volume ID")
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	resp, err := r.healer.ListStagedVolumes(cctx, &healerv1alpha1.ListStagedVolumesRequest{MaxEntries: 1})
	if err != nil {
		r.record(CheckVolumeUnderTest, Fail, "no volume given, and ListStagedVolumes failed: %s", describeErr(err))
		return false
	}
	if len(resp.GetEntries()) == 0 || resp.GetEntries()[0].GetVolumeId() == "" {
		r.record(CheckVolumeUnderTest, Fail, "no volume given, and ListStagedVolumes lists none: stage a volume or pass its ID")
		return false
	}
	r.volume = resp.GetEntries()[0].GetVolumeId()
	fmt.Fprintf(r.opts.Out, "using volume %q (the first one ListStagedVolumes returned)\n", r.volume)
	return true
}

// prepareVolume makes the volume under test staged and healthy, so that the run starts from a
// known state. A control that fails here is not used for the rest of the run.
func (r *runner) prepareVolume(ctx context.Context) {
	err := r.control.SetStaged(ctx, r.volume, true)
	if err == nil {
		err = r.control.SetFault(ctx, r.volume, Healthy, 0)
	}
	if err != nil {
		r.record(CheckControl, Fail, "%sstage and restore volume %q: %v; the checks that need it are skipped", controlFailedDetailPrefix, r.volume, err)
		r.control = nil
	}
}

func (r *runner) restoreVolume(ctx context.Context) {
	if r.control == nil {
		return
	}
	err := r.control.SetStaged(ctx, r.volume, true)
	if err == nil {
		err = r.control.SetFault(ctx, r.volume, Healthy, 0)
	}
	if err != nil {
		r.record(CheckRestoreVolume, Fail, "%srestore volume %q after the run: %v", controlFailedDetailPrefix, r.volume, err)
	}
}

// setFault breaks or restores the volume under test; a failure is recorded against check.
func (r *runner) setFault(ctx context.Context, check string, f Fault, hang time.Duration) bool {
	if err := r.control.SetFault(ctx, r.volume, f, hang); err != nil {
		r.record(check, Fail, "%sput volume %q in fault %s: %v", controlFailedDetailPrefix, r.volume, f, err)
		return false
	}
	return true
}

// --- checks on the volume under test ---

func (r *runner) checkProbeHealthyVolume(ctx context.Context) {
	resp, err := r.probe(ctx, r.volume, "")
	if err != nil {
		r.record(CheckProbeHealthyVolume, Fail, "ProbeVolume(%q): %s", r.volume, describeErr(err))
		return
	}
	r.healable, r.healableKnown = resp.GetHealable(), true
	r.healthyKept = resp.GetKept()
	if p := answerProblems(resp.GetHealthStatuses(), resp.GetRecheckAfter()); p != "" {
		r.record(CheckProbeHealthyVolume, Fail, "ProbeVolume(%q): %s", r.volume, p)
		return
	}
	if len(resp.GetHealthStatuses()) > 0 {
		hint := "pass a healthy volume"
		if r.control != nil {
			hint = "the control had just made it healthy"
		}
		r.record(CheckProbeHealthyVolume, Fail, "ProbeVolume(%q) reports %s, want empty health (%s)",
			r.volume, describeHealth(resp.GetHealthStatuses()), hint)
		return
	}
	r.record(CheckProbeHealthyVolume, Pass, "empty health, healable=%t, kept=%t", resp.GetHealable(), resp.GetKept())
}

func (r *runner) checkWrongStagingPath(ctx context.Context) {
	_, err := r.probe(ctx, r.volume, noSuchStagingPath)
	r.expectCode(CheckWrongStagingPath, fmt.Sprintf("ProbeVolume(%q) with staging_target_path %s", r.volume, noSuchStagingPath),
		err, codes.FailedPrecondition)
}

// checkRPCsMatchCapabilities calls every Healer RPC once: an advertised one must not answer
// UNIMPLEMENTED, one that is not advertised must.
func (r *runner) checkRPCsMatchCapabilities(ctx context.Context) {
	calls := []struct {
		rpc  healerv1alpha1.HealerCapability_RPC_Type
		name string
		call func() error
	}{
		{healerv1alpha1.HealerCapability_RPC_PROBE, "ProbeVolume", func() error {
			_, err := r.probe(ctx, r.volume, "")
			return err
		}},
		{healerv1alpha1.HealerCapability_RPC_HEAL, "HealVolume", func() error {
			// The volume is healthy, so an implemented heal has nothing to do.
			_, err := r.heal(ctx, r.volume, "")
			return err
		}},
		{healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES, "ListStagedVolumes", func() error {
			_, err := r.list(ctx, 0, "")
			return err
		}},
	}
	var problems, summary []string
	for _, c := range calls {
		code := status.Code(c.call())
		advertised := r.advertises(c.rpc)
		switch {
		case advertised && code == codes.Unimplemented:
			problems = append(problems, fmt.Sprintf("%s is advertised (%s) but answers UNIMPLEMENTED", c.name, c.rpc))
		case !advertised && code != codes.Unimplemented:
			problems = append(problems, fmt.Sprintf("%s is not advertised but answers %s, want UNIMPLEMENTED", c.name, codeName(code)))
		case advertised:
			summary = append(summary, c.name+" served")
		default:
			summary = append(summary, c.name+" UNIMPLEMENTED")
		}
	}
	if len(problems) > 0 {
		r.record(CheckRPCsMatchCapabilities, Fail, "%s", strings.Join(problems, "; "))
		return
	}
	r.record(CheckRPCsMatchCapabilities, Pass, "%s", strings.Join(summary, ", "))
}

func (r *runner) checkHealHealthyVolume(ctx context.Context) {
	if !r.advertises(healerv1alpha1.HealerCapability_RPC_HEAL) {
		r.record(CheckHealHealthyVolume, Skip, "the driver does not advertise HEAL")
		return
	}
	if !r.healableKnown {
		r.record(CheckHealHealthyVolume, Skip, "the probe of volume %q failed, so whether it is healable is unknown", r.volume)
		return
	}
	resp, err := r.heal(ctx, r.volume, "")
	if !r.healable {
		r.expectCode(CheckHealHealthyVolume, fmt.Sprintf("HealVolume(%q) of a volume whose probe said healable=false", r.volume),
			err, codes.FailedPrecondition)
		return
	}
	if err != nil {
		r.record(CheckHealHealthyVolume, Fail, "HealVolume(%q) of a healthy volume: %s, want OK (a heal must be idempotent)", r.volume, describeErr(err))
		return
	}
	if p := answerProblems(resp.GetHealthStatuses(), resp.GetRecheckAfter()); p != "" {
		r.record(CheckHealHealthyVolume, Fail, "HealVolume(%q): %s", r.volume, p)
		return
	}
	if len(resp.GetHealthStatuses()) > 0 {
		r.record(CheckHealHealthyVolume, Fail, "HealVolume(%q) of a healthy volume reports %s, want empty health", r.volume, describeHealth(resp.GetHealthStatuses()))
		return
	}
	r.record(CheckHealHealthyVolume, Pass, "OK with empty health: healing a healthy volume changes nothing")
}

// brokenProbes pairs each fault with the health status a probe must report for it.
var brokenProbes = []struct {
	fault Fault
	want  csi.VolumeHealthErrorType
}{
	{Gone, csi.VolumeHealthErrorType_INACCESSIBLE},
	{ReadOnly, csi.VolumeHealthErrorType_DEGRADED},
	{Lost, csi.VolumeHealthErrorType_DATA_LOSS},
}

func (r *runner) checkProbeBrokenVolume(ctx context.Context) {
	if r.control == nil {
		r.record(CheckProbeBrokenVolume, Skip, "no control given: a volume cannot be broken on purpose")
		return
	}
	defer r.control.SetFault(ctx, r.volume, Healthy, 0) // restoreVolume reports a failing control
	var seen []string
	for _, b := range brokenProbes {
		if !r.setFault(ctx, CheckProbeBrokenVolume, b.fault, 0) {
			return
		}
		resp, err := r.probe(ctx, r.volume, "")
		if err != nil {
			r.record(CheckProbeBrokenVolume, Fail, "ProbeVolume(%q) while %s: %s, want OK with %s health", r.volume, b.fault, describeErr(err), b.want)
			return
		}
		if p := answerProblems(resp.GetHealthStatuses(), resp.GetRecheckAfter()); p != "" {
			r.record(CheckProbeBrokenVolume, Fail, "ProbeVolume(%q) while %s: %s", r.volume, b.fault, p)
			return
		}
		if !hasStatus(resp.GetHealthStatuses(), b.want) {
			r.record(CheckProbeBrokenVolume, Fail, "ProbeVolume(%q) while %s reports %s, want a %s entry",
				r.volume, b.fault, describeHealth(resp.GetHealthStatuses()), b.want)
			return
		}
		seen = append(seen, fmt.Sprintf("%s: %s", b.fault, describeHealth(resp.GetHealthStatuses())))
	}
	r.record(CheckProbeBrokenVolume, Pass, "%s", strings.Join(seen, "; "))
}

// healSkip returns why the heal checks cannot run, or "" when they can.
func (r *runner) healSkip() string {
	switch {
	case !r.advertises(healerv1alpha1.HealerCapability_RPC_HEAL):
		return "the driver does not advertise HEAL"
	case r.control == nil:
		return "no control given: a volume cannot be broken on purpose, so no heal can be verified"
	case !r.healableKnown:
		return fmt.Sprintf("the probe of volume %q failed, so whether it is healable is unknown", r.volume)
	case !r.healable:
		return fmt.Sprintf(notHealableSkipDetailPattern, r.volume)
	}
	return ""
}

func (r *runner) checkHealBrokenVolume(ctx context.Context) {
	if why := r.healSkip(); why != "" {
		r.record(CheckHealBrokenVolume, Skip, "%s", why)
		return
	}
	defer r.control.SetFault(ctx, r.volume, Healthy, 0) // restoreVolume reports a failing control
	var healed []string
	for _, f := range []Fault{Gone, ReadOnly} {
		if !r.setFault(ctx, CheckHealBrokenVolume, f, 0) {
			return
		}
		resp, err := r.heal(ctx, r.volume, "")
		if err != nil {
			r.record(CheckHealBrokenVolume, Fail, "HealVolume(%q) while %s: %s, want OK", r.volume, f, describeErr(err))
			return
		}
		if p := answerProblems(resp.GetHealthStatuses(), resp.GetRecheckAfter()); p != "" {
			r.record(CheckHealBrokenVolume, Fail, "HealVolume(%q) while %s: %s", r.volume, f, p)
			return
		}
		if len(resp.GetHealthStatuses()) > 0 {
			r.record(CheckHealBrokenVolume, Fail, "HealVolume(%q) while %s reports %s after the heal, want empty health",
				r.volume, f, describeHealth(resp.GetHealthStatuses()))
			return
		}
		probe, err := r.probe(ctx, r.volume, "")
		if err != nil {
			r.record(CheckHealBrokenVolume, Fail, "ProbeVolume(%q) after healing %s: %s", r.volume, f, describeErr(err))
			return
		}
		if len(probe.GetHealthStatuses()) > 0 {
			r.record(CheckHealBrokenVolume, Fail, "HealVolume(%q) answered healthy, but the next probe reports %s: the heal did not repair %s",
				r.volume, describeHealth(probe.GetHealthStatuses()), f)
			return
		}
		healed = append(healed, string(f))
	}
	r.record(CheckHealBrokenVolume, Pass, "healed %s; the next probe reported empty health each time", strings.Join(healed, " and "))
}

func (r *runner) checkHealDataLoss(ctx context.Context) {
	if why := r.healSkip(); why != "" {
		r.record(CheckHealDataLoss, Skip, "%s", why)
		return
	}
	defer r.control.SetFault(ctx, r.volume, Healthy, 0) // restoreVolume reports a failing control
	if !r.setFault(ctx, CheckHealDataLoss, Lost, 0) {
		return
	}
	// A driver may say that it cannot heal a lost volume at all (healable false): its heal must
	// then be refused, as for any volume it cannot heal. One that offers to heal it must run the
	// heal and report the loss that remains.
	probed, err := r.probe(ctx, r.volume, "")
	if err != nil {
		r.record(CheckHealDataLoss, Fail, "ProbeVolume(%q) of a lost volume: %s", r.volume, describeErr(err))
		return
	}
	resp, err := r.heal(ctx, r.volume, "")
	if !probed.GetHealable() {
		if status.Code(err) != codes.FailedPrecondition {
			r.record(CheckHealDataLoss, Fail, "HealVolume(%q) of a lost volume that the probe called not healable: %s, want FAILED_PRECONDITION",
				r.volume, describeErr(err))
			return
		}
		r.record(CheckHealDataLoss, Pass, "not healable, and HealVolume was refused with FAILED_PRECONDITION")
		return
	}
	if err != nil {
		r.record(CheckHealDataLoss, Fail, "HealVolume(%q) of a lost volume that the probe called healable: %s, want OK with the DATA_LOSS that remains (a heal that ran is not an error)",
			r.volume, describeErr(err))
		return
	}
	if p := answerProblems(resp.GetHealthStatuses(), resp.GetRecheckAfter()); p != "" {
		r.record(CheckHealDataLoss, Fail, "HealVolume(%q) of a lost volume: %s", r.volume, p)
		return
	}
	if !hasStatus(resp.GetHealthStatuses(), csi.VolumeHealthErrorType_DATA_LOSS) {
		r.record(CheckHealDataLoss, Fail, "HealVolume(%q) of a lost volume reports %s, want the DATA_LOSS that remains",
			r.volume, describeHealth(resp.GetHealthStatuses()))
		return
	}
	r.record(CheckHealDataLoss, Pass, "OK with %s: the heal ran and reported what it could not repair", describeHealth(resp.GetHealthStatuses()))
}

func (r *runner) checkNotStagedVolume(ctx context.Context) {
	if r.control == nil {
		r.record(CheckNotStagedVolume, Skip, "no control given: a volume cannot be unstaged on purpose")
		return
	}
	if err := r.control.SetStaged(ctx, r.volume, false); err != nil {
		r.record(CheckNotStagedVolume, Fail, "%sunstage volume %q: %v", controlFailedDetailPrefix, r.volume, err)
		return
	}
	defer r.control.SetStaged(ctx, r.volume, true) // restoreVolume reports a failing control

	_, err := r.probe(ctx, r.volume, "")
	if status.Code(err) != codes.FailedPrecondition {
		r.record(CheckNotStagedVolume, Fail, "ProbeVolume(%q) of a volume not staged on the node: %s, want FAILED_PRECONDITION", r.volume, describeErr(err))
		return
	}
	checked := []string{"ProbeVolume"}
	if r.advertises(healerv1alpha1.HealerCapability_RPC_HEAL) {
		_, err := r.heal(ctx, r.volume, "")
		if status.Code(err) != codes.FailedPrecondition {
			r.record(CheckNotStagedVolume, Fail, "HealVolume(%q) of a volume not staged on the node: %s, want FAILED_PRECONDITION", r.volume, describeErr(err))
			return
		}
		checked = append(checked, "HealVolume")
	}
	if r.advertises(healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES) {
		ids, problem := r.listAll(ctx, 0)
		if problem != "" {
			r.record(CheckNotStagedVolume, Fail, "ListStagedVolumes: %s", problem)
			return
		}
		if slices.Contains(ids, r.volume) {
			r.record(CheckNotStagedVolume, Fail, "ListStagedVolumes lists volume %q, which is not staged", r.volume)
			return
		}
		checked = append(checked, "ListStagedVolumes leaves it out")
	}
	r.record(CheckNotStagedVolume, Pass, "%s: FAILED_PRECONDITION", strings.Join(checked, ", "))
}

// checkConcurrentCallsAborted sends a second call on the volume while a first one is in
// flight; the driver must reject one of them with ABORTED. With a control the first call is
// held by a hung volume; without one, many calls race and the check can only hope they overlap.
func (r *runner) checkConcurrentCallsAborted(ctx context.Context) {
	if r.control == nil {
		r.raceForAborted(ctx)
		return
	}
	if !r.setFault(ctx, CheckConcurrentCallsAborted, Hung, r.opts.HangFor) {
		return
	}
	defer r.control.SetFault(ctx, r.volume, Healthy, 0) // restoreVolume reports a failing control

	type answer struct {
		resp *healerv1alpha1.ProbeVolumeResponse
		err  error
	}
	first := make(chan answer, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, r.opts.HangFor+r.opts.CallTimeout)
		defer cancel()
		resp, err := r.healer.ProbeVolume(cctx, &healerv1alpha1.ProbeVolumeRequest{VolumeId: r.volume})
		first <- answer{resp, err}
	}()
	// Give the first call time to reach the driver and take the volume's lock.
	select {
	case a := <-first:
		r.record(CheckConcurrentCallsAborted, Fail, "ProbeVolume(%q) of a hung volume returned (%s) within a quarter of the hang (%s): the hung fault did not hold the call",
			r.volume, describeErr(a.err), r.opts.HangFor)
		return
	case <-time.After(r.opts.HangFor / 4):
	}
	_, secondErr := r.probe(ctx, r.volume, "")
	var healErr error
	healTried := false
	if r.advertises(healerv1alpha1.HealerCapability_RPC_HEAL) && r.healable && len(first) == 0 {
		_, healErr = r.heal(ctx, r.volume, "")
		// Only a heal that came back while the first call was still held proves anything: one
		// that found the first call over (a slow machine) was free to run.
		healTried = len(first) == 0 || status.Code(healErr) == codes.Aborted
	}
	a := <-first
	if a.err == nil {
		r.observe(a.resp.GetHealthStatuses())
	}

	switch {
	case status.Code(secondErr) == codes.Aborted && a.err == nil:
	case status.Code(a.err) == codes.Aborted && secondErr == nil:
		// The second call reached the driver first; the rejection is just as good.
	case a.err == nil && secondErr == nil:
		r.record(CheckConcurrentCallsAborted, Fail, "two overlapping ProbeVolume(%q) calls both succeeded; while one is in flight the other must get ABORTED", r.volume)
		return
	default:
		r.record(CheckConcurrentCallsAborted, Fail, "two overlapping ProbeVolume(%q) calls answered %s and %s; want one OK and one ABORTED",
			r.volume, describeErr(a.err), describeErr(secondErr))
		return
	}
	if healTried && status.Code(healErr) != codes.Aborted {
		r.record(CheckConcurrentCallsAborted, Fail, "HealVolume(%q) while a ProbeVolume was in flight: %s, want ABORTED (probe and heal share the volume's lock)",
			r.volume, describeErr(healErr))
		return
	}
	detail := "a ProbeVolume during a hung ProbeVolume got ABORTED"
	if healTried {
		detail += ", and so did a HealVolume"
	}
	r.record(CheckConcurrentCallsAborted, Pass, "%s", detail)
}

func (r *runner) raceForAborted(ctx context.Context) {
	var aborted, total int
	var unexpected []string
	for range racingRounds {
		start := make(chan struct{})
		errs := make([]error, racingCalls)
		var wg sync.WaitGroup
		for i := range racingCalls {
			wg.Go(func() {
				<-start
				_, errs[i] = r.probe(ctx, r.volume, "")
			})
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			total++
			switch status.Code(err) {
			case codes.OK:
			case codes.Aborted:
				aborted++
			default:
				unexpected = append(unexpected, describeErr(err))
			}
		}
	}
	switch {
	case len(unexpected) > 0:
		slices.Sort(unexpected)
		r.record(CheckConcurrentCallsAborted, Fail, "racing ProbeVolume(%q) calls answered %s; want OK or ABORTED only",
			r.volume, strings.Join(slices.Compact(unexpected), ", "))
	case aborted > 0:
		r.record(CheckConcurrentCallsAborted, Pass, "%d of %d racing ProbeVolume calls got ABORTED", aborted, total)
	default:
		r.record(CheckConcurrentCallsAborted, Skip, "none of %d racing ProbeVolume calls was rejected with ABORTED: either the probes were too quick to overlap or the driver has no per-volume lock; give a control so that a hung volume holds a call in flight", total)
	}
}

func (r *runner) checkListStagedVolumes(ctx context.Context) {
	if !r.advertises(healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES) {
		r.record(CheckListStagedVolumes, Skip, "the driver does not advertise LIST_VOLUMES")
		return
	}
	_, err := r.list(ctx, -1, "")
	if status.Code(err) != codes.InvalidArgument {
		r.record(CheckListStagedVolumes, Fail, "ListStagedVolumes with max_entries=-1: %s, want INVALID_ARGUMENT", describeErr(err))
		return
	}
	all, problem := r.listAll(ctx, 0)
	if problem != "" {
		r.record(CheckListStagedVolumes, Fail, "listing without a page size: %s", problem)
		return
	}
	if !slices.Contains(all, r.volume) {
		r.record(CheckListStagedVolumes, Fail, "the listing does not contain volume %q, which is staged", r.volume)
		return
	}
	slices.Sort(all)
	for _, size := range []int32{1, 2} {
		paged, problem := r.listAll(ctx, size)
		if problem != "" {
			r.record(CheckListStagedVolumes, Fail, "listing %d at a time: %s", size, problem)
			return
		}
		slices.Sort(paged)
		if !slices.Equal(paged, all) {
			r.record(CheckListStagedVolumes, Fail, "listing %d at a time returned %v, but one listing returned %v", size, paged, all)
			return
		}
	}
	r.record(CheckListStagedVolumes, Pass, "%d staged volume(s), the same set whole and 1 or 2 at a time; max_entries=-1 is INVALID_ARGUMENT", len(all))
}

// listAll follows next_token from the start and returns every volume ID, or a problem: a page
// larger than maxEntries, an entry without volume_id, a volume listed twice, a token that
// repeats.
func (r *runner) listAll(ctx context.Context, maxEntries int32) (ids []string, problem string) {
	seen := map[string]bool{}
	tokens := map[string]bool{}
	token := ""
	for page := 0; page < maxListPages; page++ {
		resp, err := r.list(ctx, maxEntries, token)
		if err != nil {
			return nil, fmt.Sprintf("page %d: %s", page+1, describeErr(err))
		}
		if maxEntries > 0 && len(resp.GetEntries()) > int(maxEntries) {
			return nil, fmt.Sprintf("page %d has %d entries, more than max_entries=%d", page+1, len(resp.GetEntries()), maxEntries)
		}
		for _, e := range resp.GetEntries() {
			if e.GetVolumeId() == "" {
				return nil, fmt.Sprintf("page %d has an entry without volume_id", page+1)
			}
			if seen[e.GetVolumeId()] {
				return nil, fmt.Sprintf("volume %q is listed twice", e.GetVolumeId())
			}
			seen[e.GetVolumeId()] = true
			ids = append(ids, e.GetVolumeId())
		}
		token = resp.GetNextToken()
		if token == "" {
			return ids, ""
		}
		if tokens[token] {
			return nil, fmt.Sprintf("next_token %q came back twice: the listing never ends", token)
		}
		tokens[token] = true
	}
	return nil, fmt.Sprintf("the listing did not end within %d pages", maxListPages)
}

func (r *runner) checkHealthVocabulary() {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case len(r.healthProblems) > 0:
		r.record(CheckHealthVocabulary, Fail, "%s", strings.Join(slices.Compact(r.healthProblems), "; "))
	case r.healthEntries == 0:
		r.record(CheckHealthVocabulary, Skip, "no answer in the run reported an adverse health condition, so there was no status or reason to check; give a control to break volumes")
	default:
		r.record(CheckHealthVocabulary, Pass, "%d health entries in %d answers: statuses DEGRADED, INACCESSIBLE or DATA_LOSS, CamelCase reasons", r.healthEntries, r.healthAnswers)
	}
}
