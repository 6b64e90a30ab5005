package driverkit

import (
	"cmp"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// Reasons the kit reports in health entries. They are stable across releases: policies and alerts
// may match on them. docs/protocol.md lists them with their meaning.
const (
	// ReasonMountGone (INACCESSIBLE): nothing is mounted at the path, or the path does not exist.
	ReasonMountGone = "MountGone"
	// ReasonMountDisconnected (INACCESSIBLE): the mount is there but every access fails with a
	// corrupted-mount error, as k8s.io/mount-utils' IsCorruptedMnt defines it (ENOTCONN, ESTALE, EIO,
	// EACCES, EHOSTDOWN, EWOULDBLOCK, ENODEV), or ECONNABORTED (a FUSE request whose connection was
	// aborted under it): its mounter died.
	ReasonMountDisconnected = "MountDisconnected"
	// ReasonMountHung (INACCESSIBLE): a stat of the path did not return before the deadline: the
	// mounter is alive but does not answer.
	ReasonMountHung = "MountHung"
	// ReasonReadOnlyMount (DEGRADED): the mount is read-only where read-write was expected.
	ReasonReadOnlyMount = "ReadOnlyMount"
	// ReasonWrongMountSource (INACCESSIBLE): something else than the volume is mounted at the path.
	ReasonWrongMountSource = "WrongMountSource"
	// ReasonWrongFilesystemType (INACCESSIBLE): the mount at the path has another filesystem type
	// than the volume's.
	ReasonWrongFilesystemType = "WrongFilesystemType"
	// ReasonMountCheckFailed (INACCESSIBLE): the path could not be checked for another reason
	// (the message says which).
	ReasonMountCheckFailed = "MountCheckFailed"
	// ReasonStaleMountInPods (INACCESSIBLE): the volume was repaired on the node, but running
	// processes in other mount namespaces (pods whose mount propagation is None) still see the
	// dead mount; those pods must be restarted to see the repaired volume. The controller acts on
	// it (see healerv1alpha1.ReasonStaleMountInPods): it asks the operator to restart the pods.
	ReasonStaleMountInPods = healerv1alpha1.ReasonStaleMountInPods
	// ReasonDataLoss (DATA_LOSS): for drivers to report through Driver.Inspect when the volume's
	// data is gone; the kit never repairs it.
	ReasonDataLoss = "DataLoss"
)

// Finding is one adverse condition of one path of a volume.
type Finding struct {
	// Path is the staging or publish path the finding is about ("" for the volume as a whole).
	Path string
	// Status is the CSI health status: DEGRADED, INACCESSIBLE or DATA_LOSS.
	Status csi.VolumeHealthErrorType
	// Reason is one of the Reason constants (or a driver's own CamelCase word).
	Reason string
	// Message is a sentence for people, naming the path and the error.
	Message string
}

// Health turns findings into the health entries of a probe or heal response: one entry per
// (status, reason), messages of merged findings joined with "; ", in a deterministic order.
// No findings give an empty list: healthy.
func Health(findings []Finding) []*csi.VolumeHealth_VolumeHealthEntry {
	type key struct {
		status csi.VolumeHealthErrorType
		reason string
	}
	var order []key
	messages := map[key][]string{}
	for _, f := range findings {
		k := key{status: f.Status, reason: f.Reason}
		// The protocol forbids UNKNOWN_VOLUME_HEALTH_TYPE on the wire; a finding without a
		// status still says something is wrong, and INACCESSIBLE keeps it from being ignored.
		if k.status == csi.VolumeHealthErrorType_UNKNOWN_VOLUME_HEALTH_TYPE {
			k.status = csi.VolumeHealthErrorType_INACCESSIBLE
		}
		if k.reason == "" {
			k.reason = ReasonMountCheckFailed
		}
		if _, ok := messages[k]; !ok {
			order = append(order, k)
			messages[k] = nil
		}
		if msg := findingMessage(f); msg != "" && !slices.Contains(messages[k], msg) {
			messages[k] = append(messages[k], msg)
		}
	}
	slices.SortFunc(order, func(a, b key) int {
		return cmp.Or(cmp.Compare(a.status, b.status), cmp.Compare(a.reason, b.reason))
	})
	entries := make([]*csi.VolumeHealth_VolumeHealthEntry, 0, len(order))
	for _, k := range order {
		entries = append(entries, &csi.VolumeHealth_VolumeHealthEntry{
			Status:  k.status,
			Reason:  k.reason,
			Message: strings.Join(messages[k], "; "),
		})
	}
	return entries
}

// findingMessage is a finding's message, led by its path when the message does not name it, so
// that a merged entry still says which path each part is about.
func findingMessage(f Finding) string {
	switch {
	case f.Path == "" || strings.Contains(f.Message, f.Path):
		return f.Message
	case f.Message == "":
		return f.Path + ": " + f.Reason
	default:
		return f.Path + ": " + f.Message
	}
}
