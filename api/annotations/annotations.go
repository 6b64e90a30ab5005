// Package annotations is the contract that volume-healer keeps on Kubernetes objects: every
// annotation and label key that the controller, the sidecar, healerctl and operators read or
// write, and the one merge patch that writes annotations. Keys shared by two binaries are defined
// here and nowhere else.
//
// It imports nothing of the project and nothing of Kubernetes, so that every binary, and a driver
// that wants to read the same keys, can import it for free.
package annotations

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"time"
)

// HealerRestartValue is the value of HealerRestart for a start of the healer sidecar at t in the
// pod podUID: the time in UTC, RFC 3339 with nanoseconds, then "/" and the pod UID when known.
func HealerRestartValue(t time.Time, podUID string) string {
	v := t.UTC().Format(time.RFC3339Nano)
	if podUID != "" {
		v += "/" + podUID
	}
	return v
}

// HealerRestartTime reads the start time out of a HealerRestart value; false when it holds none.
func HealerRestartTime(v string) (time.Time, bool) {
	at, _, _ := strings.Cut(v, "/")
	t, err := time.Parse(time.RFC3339Nano, at)
	return t, err == nil
}

// On a CSIAddonsNode: the restart marker and the sidecar's address.
//
// The restart marker of a node plugin is made of CSIAddonsPod, CSIAddonsRestart and
// HealerRestart, in that order; the controller sweeps the driver's volumes on the node when it
// changes, and records the marker it swept in HandledMarker.
const (
	// CSIAddonsRestart is set by the csi-addons sidecar on every start.
	CSIAddonsRestart = "sidecar.csiaddons.openshift.io/lastUpdatedAt"
	// CSIAddonsPod is set by the csi-addons sidecar to the UID of the pod it runs in. An object
	// carrying it belongs to the csi-addons sidecar.
	CSIAddonsPod = "sidecar.csiaddons.openshift.io/createdByPodUID"
	// HealerRestart is set by the healer sidecar on every start: "<RFC 3339 time with
	// nanoseconds>/<pod UID>".
	HealerRestart = "healer.csiaddons.openshift.io/restarted-at"
	// Endpoint is the "host:port" where the healer sidecar serves NodeHealer, written by the
	// sidecar. spec.driver.endpoint belongs to the csi-addons sidecar when one runs in the pod, so
	// the healer sidecar's endpoint lives here.
	Endpoint = "healer.csiaddons.openshift.io/endpoint"
	// HandledMarker records the restart marker whose sweep has finished, so that a controller
	// restart or a new leader neither loses a pending restart sweep nor repeats one. Written by
	// the controller.
	HandledMarker = "healer.csiaddons.openshift.io/handled-marker"
	// Registration labels every CSIAddonsNode on which the healer sidecar of a driver and node
	// wrote its endpoint, with RegistrationValue of both, so that the sidecar finds those objects
	// again with a label selector instead of listing every node's objects. Written by the sidecar.
	Registration = "healer.csiaddons.openshift.io/registration"
)

// RegistrationValue is the Registration label's value for driver on node: 40 hex digits of the
// SHA-256 of both, since a node name may be longer than a label value may be.
func RegistrationValue(driver, node string) string {
	sum := sha256.Sum256([]byte(driver + "\x00" + node))
	return hex.EncodeToString(sum[:20])
}

// On a PVC, a StorageClass or a CSIAddonsNode: manual sweeps. An operator (or `healerctl sweep`)
// sets SweepRequest to a new value; when the sweep has finished the controller copies the value to
// SweepHandled, so that a request is swept once across controller restarts and leader changes.
const (
	// SweepRequest requests a manual sweep; its value identifies the request.
	SweepRequest = "healer.csiaddons.openshift.io/sweep"
	// SweepHandled holds the value of the last request whose sweep has finished.
	SweepHandled = "healer.csiaddons.openshift.io/sweep-handled"
)

// On a StorageClass.
const (
	// Schedule sets the cron schedule of the class's periodic sweeps. It wins over the
	// configuration's per-StorageClass schedule and over the default schedule; the value
	// ScheduleOff turns periodic sweeps off for the class.
	Schedule = "healer.csiaddons.openshift.io/schedule"
	// ScheduleOff is the Schedule value that turns periodic sweeps off.
	ScheduleOff = "off"
)

// On a StorageClass or a Namespace: opting in to pod restarts.
const (
	// EvictPodsLabel with the value "true", on a StorageClass or a Namespace, lets the built-in
	// policy evict the controller-owned pods that still see a healed volume's dead mount (the
	// rule volumehealer.builtin.restart reads it; with remediation.enabled).
	EvictPodsLabel = "healer.csiaddons.openshift.io/evict-pods"
)

// On a PVC.
const (
	// VolumeStatus holds, as JSON, what the healer last found and did with the claim's volume. It
	// is written when something is wrong or was done, and removed when a later probe finds the
	// volume healthy.
	VolumeStatus = "healer.csiaddons.openshift.io/status"
)

// On a policy ConfigMap.
const (
	// PolicyLabel with the value PolicyLabelValue selects the ConfigMaps that hold policies,
	// unless the configuration selects them otherwise.
	PolicyLabel = "healer.csiaddons.openshift.io/policy"
	// PolicyLabelValue is the value of PolicyLabel on a policy ConfigMap.
	PolicyLabelValue = "rego"
	// PolicySelector is the label selector made of PolicyLabel and PolicyLabelValue.
	PolicySelector = PolicyLabel + "=" + PolicyLabelValue
	// PolicyStatus is written by the controller on every policy ConfigMap: whether its policy
	// serves, and if not, why (JSON).
	PolicyStatus = "healer.csiaddons.openshift.io/policy-status"
	// PolicyLastGoodRevision, on the ConfigMap that keeps the last accepted policy set, names the
	// revision that set compiled to.
	PolicyLastGoodRevision = "healer.csiaddons.openshift.io/policy-last-good-revision"
)

// MergePatch returns the body of a JSON merge patch (types.MergePatchType) that sets the
// annotations in set and removes those named in remove, and touches nothing else of the object:
// it needs no resourceVersion and cannot undo what another writer (a csi-addons sidecar, an
// operator) set on other keys.
func MergePatch(set map[string]string, remove ...string) []byte {
	return LabeledMergePatch(set, nil, remove...)
}

// LabeledMergePatch is MergePatch that also sets the labels in labels.
func LabeledMergePatch(set, labels map[string]string, remove ...string) []byte {
	values := make(map[string]any, len(set)+len(remove))
	for key, v := range set {
		values[key] = v
	}
	for _, key := range remove {
		values[key] = nil
	}
	metadata := map[string]any{"annotations": values}
	if len(labels) > 0 {
		metadata["labels"] = labels
	}
	// A map of strings and nils always encodes.
	body, _ := json.Marshal(map[string]any{"metadata": metadata})
	return body
}
