package sanity

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/durationpb"
)

// camelCase is the shape CSI asks of a health reason: "MountGone", "ReadOnlyMount".
var camelCase = regexp.MustCompile(`^[A-Z][a-zA-Z0-9]*$`)

// healthProblems lists what is wrong with a health list: a status outside the CSI v1.13
// vocabulary, a reason that is empty or not CamelCase, or a repeated (status, reason).
func healthProblems(entries []*csi.VolumeHealth_VolumeHealthEntry) []string {
	var problems []string
	seen := map[string]bool{}
	for i, e := range entries {
		switch e.GetStatus() {
		case csi.VolumeHealthErrorType_DEGRADED, csi.VolumeHealthErrorType_INACCESSIBLE, csi.VolumeHealthErrorType_DATA_LOSS:
		default:
			problems = append(problems, fmt.Sprintf("entry %d has status %s, not DEGRADED, INACCESSIBLE or DATA_LOSS", i, e.GetStatus()))
		}
		switch {
		case e.GetReason() == "":
			problems = append(problems, fmt.Sprintf("entry %d has an empty reason", i))
		case !camelCase.MatchString(e.GetReason()):
			problems = append(problems, fmt.Sprintf("entry %d has reason %q, which is not CamelCase", i, e.GetReason()))
		}
		key := e.GetStatus().String() + "/" + e.GetReason()
		if seen[key] {
			problems = append(problems, fmt.Sprintf("entry %d repeats %s", i, key))
		}
		seen[key] = true
	}
	return problems
}

// recheckProblem says what is wrong with a recheck_after, or "" when it is unset or valid.
func recheckProblem(d *durationpb.Duration) string {
	if d == nil {
		return ""
	}
	if err := d.CheckValid(); err != nil {
		return fmt.Sprintf("recheck_after is not a valid duration: %v", err)
	}
	if d.AsDuration() <= 0 {
		return fmt.Sprintf("recheck_after is %s; when set it must be positive", d.AsDuration())
	}
	return ""
}

// describeHealth renders a health list for a report line: "INACCESSIBLE/MountGone", or
// "healthy" for an empty list.
func describeHealth(entries []*csi.VolumeHealth_VolumeHealthEntry) string {
	if len(entries) == 0 {
		return "healthy (empty health)"
	}
	parts := make([]string, 0, len(entries))
	for _, e := range entries {
		parts = append(parts, e.GetStatus().String()+"/"+e.GetReason())
	}
	return strings.Join(parts, ", ")
}

func hasStatus(entries []*csi.VolumeHealth_VolumeHealthEntry, s csi.VolumeHealthErrorType) bool {
	for _, e := range entries {
		if e.GetStatus() == s {
			return true
		}
	}
	return false
}
