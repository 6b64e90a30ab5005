package sanity

import (
	"context"
	"fmt"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

func (r *runner) probe(ctx context.Context, volumeID, stagingPath string) (*healerv1alpha1.ProbeVolumeResponse, error) {
	cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	resp, err := r.healer.ProbeVolume(cctx, &healerv1alpha1.ProbeVolumeRequest{VolumeId: volumeID, StagingTargetPath: stagingPath})
	if err == nil {
		r.observe(resp.GetHealthStatuses())
		if resp.GetKept() {
			r.mu.Lock()
			r.keptAnswers++
			r.mu.Unlock()
		}
	}
	return resp, err
}

func (r *runner) heal(ctx context.Context, volumeID, stagingPath string) (*healerv1alpha1.HealVolumeResponse, error) {
	cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	resp, err := r.healer.HealVolume(cctx, &healerv1alpha1.HealVolumeRequest{VolumeId: volumeID, StagingTargetPath: stagingPath})
	if err == nil {
		r.observe(resp.GetHealthStatuses())
	}
	return resp, err
}

func (r *runner) list(ctx context.Context, maxEntries int32, token string) (*healerv1alpha1.ListStagedVolumesResponse, error) {
	cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	return r.healer.ListStagedVolumes(cctx, &healerv1alpha1.ListStagedVolumesRequest{MaxEntries: maxEntries, StartingToken: token})
}

// observe feeds one answer's health list to the health-vocabulary check.
func (r *runner) observe(entries []*csi.VolumeHealth_VolumeHealthEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.healthAnswers++
	r.healthEntries += len(entries)
	r.healthProblems = append(r.healthProblems, healthProblems(entries)...)
}

func (r *runner) expectCode(check, what string, err error, want codes.Code) {
	if got := status.Code(err); got != want {
		r.record(check, Fail, "%s: %s, want %s", what, describeErr(err), codeName(want))
		return
	}
	r.record(check, Pass, "%s", codeName(want))
}

// answerProblems checks the health list and recheck_after of one answer.
func answerProblems(entries []*csi.VolumeHealth_VolumeHealthEntry, recheck *durationpb.Duration) string {
	problems := healthProblems(entries)
	if p := recheckProblem(recheck); p != "" {
		problems = append(problems, p)
	}
	return strings.Join(problems, "; ")
}

// describeErr renders a call's outcome as "OK" or "NOT_FOUND (message)".
func describeErr(err error) string {
	if err == nil {
		return "OK"
	}
	s := status.Convert(err)
	return fmt.Sprintf("%s (%s)", codeName(s.Code()), s.Message())
}

// codeName writes a gRPC code the way the protocol documents it: NOT_FOUND, not NotFound.
func codeName(c codes.Code) string {
	name := c.String()
	var b strings.Builder
	for i, ch := range name {
		if i > 0 && ch >= 'A' && ch <= 'Z' && name[i-1] >= 'a' && name[i-1] <= 'z' {
			b.WriteByte('_')
		}
		b.WriteRune(ch)
	}
	return strings.ToUpper(b.String())
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
