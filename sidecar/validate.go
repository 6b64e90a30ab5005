package sidecar

import (
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/durationpb"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// The sidecar relays the driver's answers unchanged, but not answers that break a MUST of the
// protocol in a way the controller could misread: such an answer becomes INTERNAL, naming the
// rule, so that the driver's author sees it and the controller retries instead of acting on it.
//
// Rejected: a health entry with status UNKNOWN_VOLUME_HEALTH_TYPE (0) or an empty reason, two
// entries with the same (status, reason), a recheck_after that is invalid or not positive, a
// listed volume without a volume_id.
//
// Passed on: status values this build does not know (a later CSI version may add some, and the
// protocol tells callers to ignore them), reasons that are not CamelCase (a SHOULD-level
// matter of style, not of meaning).

// checkHealth returns ErrMalformedResponse when entries break the health rules.
func checkHealth(entries []*csi.VolumeHealth_VolumeHealthEntry) error {
	seen := make(map[string]bool, len(entries))
	for i, e := range entries {
		if e.GetStatus() == csi.VolumeHealthErrorType_UNKNOWN_VOLUME_HEALTH_TYPE {
			return fmt.Errorf("%w: health entry %d has status UNKNOWN_VOLUME_HEALTH_TYPE, which must not be sent", ErrMalformedResponse, i)
		}
		if e.GetReason() == "" {
			return fmt.Errorf("%w: health entry %d (%s) has an empty reason; a CamelCase reason is required", ErrMalformedResponse, i, e.GetStatus())
		}
		key := fmt.Sprintf("%d/%s", e.GetStatus(), e.GetReason())
		if seen[key] {
			return fmt.Errorf("%w: health entry %d repeats %s/%s", ErrMalformedResponse, i, e.GetStatus(), e.GetReason())
		}
		seen[key] = true
	}
	return nil
}

// checkRecheck returns ErrMalformedResponse for a recheck_after that is set but not a positive
// duration.
func checkRecheck(d *durationpb.Duration) error {
	if d == nil {
		return nil
	}
	if err := d.CheckValid(); err != nil {
		return fmt.Errorf("%w: recheck_after: %w", ErrMalformedResponse, err)
	}
	if d.AsDuration() <= 0 {
		return fmt.Errorf("%w: recheck_after is %s; when set it must be positive", ErrMalformedResponse, d.AsDuration())
	}
	return nil
}

func checkProbe(r *healerv1alpha1.ProbeVolumeResponse) error {
	if err := checkHealth(r.GetHealthStatuses()); err != nil {
		return err
	}
	return checkRecheck(r.GetRecheckAfter())
}

func checkHeal(r *healerv1alpha1.HealVolumeResponse) error {
	if err := checkHealth(r.GetHealthStatuses()); err != nil {
		return err
	}
	return checkRecheck(r.GetRecheckAfter())
}

func checkList(r *healerv1alpha1.ListStagedVolumesResponse) error {
	for i, e := range r.GetEntries() {
		if e.GetVolumeId() == "" {
			return fmt.Errorf("%w: listed entry %d has an empty volume_id", ErrMalformedResponse, i)
		}
	}
	return nil
}
