// Package annotations is the contract that volume-healer keeps on Kubernetes objects: every
// annotation and label key that the controller, the sidecar, healerctl and operators read or
// write, and the one merge patch that writes annotations. Keys shared by two binaries are defined
// here and nowhere else.
//
// The project's keys are under its own domain, volume-healer.io. Release 0.1.0 wrote them under
// healer.csiaddons.openshift.io; this release still reads those (Get, Keys), writes only the new
// ones and removes the old one of every key it writes (MergePatch). The release after it stops
// reading them. The keys of the csi-addons sidecar (CSIAddonsRestart, CSIAddonsPod) are that
// project's and keep its domain.
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
	HealerRestart = "volume-healer.io/restarted-at"
	// Endpoint is the "host:port" where the healer sidecar serves NodeHealer, written by the
	// sidecar. spec.driver.endpoint belongs to the csi-addons sidecar when one runs in the pod, so
	// the healer sidecar's endpoint lives here.
	Endpoint = "volume-healer.io/endpoint"
	// HandledMarker records the restart marker whose sweep has finished, so that a controller
	// restart or a new leader neither loses a pending restart sweep nor repeats one. Written by
	// the controller.
	HandledMarker = "volume-healer.io/handled-marker"
	// DriverTier holds, as JSON, what volume-healer gets from the driver on the node (its tier:
	// healer, probe-only or none) and who probes its volumes (driver or sidecar), from the
	// capabilities the sidecar last answered. Written by the controller when it changes;
	// `healerctl status` shows it.
	DriverTier = "volume-healer.io/driver-tier"
	// RestartSweep holds, as JSON, what the last finished restart sweep of the node plugin did
	// with its volumes: the marker it swept, and how many volumes it healed, found kept alive
	// across the restart by the driver, left unhealthy or skipped. Written by the controller in
	// the same patch as HandledMarker; `healerctl status` shows it.
	RestartSweep = "volume-healer.io/restart-sweep"
	// Registration labels every CSIAddonsNode on which the healer sidecar of a driver and node
	// wrote its endpoint, with RegistrationValue of both, so that the sidecar finds those objects
	// again with a label selector instead of listing every node's objects. Written by the sidecar.
	Registration = "volume-healer.io/registration"
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
	SweepRequest = "volume-healer.io/sweep"
	// SweepHandled holds the value of the last request whose sweep has finished.
	SweepHandled = "volume-healer.io/sweep-handled"
)

// On a StorageClass.
const (
	// Schedule sets the cron schedule of the class's periodic sweeps. It wins over the
	// configuration's per-StorageClass schedule and over the default schedule; the value
	// ScheduleOff turns periodic sweeps off for the class.
	Schedule = "volume-healer.io/schedule"
	// ScheduleOff is the Schedule value that turns periodic sweeps off.
	ScheduleOff = "off"
)

// On a StorageClass or a Namespace: opting in to pod restarts.
const (
	// EvictPodsLabel with the value "true", on a StorageClass or a Namespace, lets the built-in
	// policy evict the controller-owned pods that still see a healed volume's dead mount (the
	// rule volumehealer.builtin.restart reads it; with remediation.enabled).
	EvictPodsLabel = "volume-healer.io/evict-pods"
)

// On a StorageClass or a Namespace: opting in to mount propagation set at pod creation.
const (
	// MountPropagationLabel with the value MountPropagationHostToContainer, on a StorageClass or
	// a Namespace, lets the built-in policy have the propagation admission webhook set
	// mountPropagation: HostToContainer on new pods' mounts of the class's (or the namespace's)
	// CSI volumes, so that a mount healed in place on the node reaches them without a restart
	// (the rule volumehealer.builtin.propagation reads it; with propagationWebhook.enabled).
	MountPropagationLabel = "volume-healer.io/mount-propagation"
	// MountPropagationHostToContainer is the value of MountPropagationLabel that opts in.
	MountPropagationHostToContainer = "HostToContainer"
)

// On a PVC.
const (
	// VolumeStatus holds, as JSON, what the healer last found and did with the claim's volume. It
	// is written when something is wrong or was done, and removed when a later probe finds the
	// volume healthy.
	VolumeStatus = "volume-healer.io/status"
)

// On a policy ConfigMap.
const (
	// PolicyLabel with the value PolicyLabelValue selects the ConfigMaps that hold policies,
	// unless the configuration selects them otherwise.
	PolicyLabel = "volume-healer.io/policy"
	// PolicyLabelValue is the value of PolicyLabel on a policy ConfigMap.
	PolicyLabelValue = "rego"
	// PolicySelector is the label selector made of PolicyLabel and PolicyLabelValue.
	PolicySelector = PolicyLabel + "=" + PolicyLabelValue
	// PolicyStatus is written by the controller on every policy ConfigMap: whether its policy
	// serves, and if not, why (JSON).
	PolicyStatus = "volume-healer.io/policy-status"
	// PolicyLastGoodRevision, on the ConfigMap that keeps the last accepted policy set, names the
	// revision that set compiled to.
	PolicyLastGoodRevision = "volume-healer.io/policy-last-good-revision"
)

// MergePatch returns the body of a JSON merge patch (types.MergePatchType) that sets the
// annotations in set and removes those named in remove, and touches nothing else of the object:
// it needs no resourceVersion and cannot undo what another writer (a csi-addons sidecar, an
// operator) set on other keys. It also removes the previous release's key (Previous) of every key
// it sets or removes, so that an object carries one value of each key, and a value the previous
// release wrote never outlives the one that replaced it.
func MergePatch(set map[string]string, remove ...string) []byte {
	return LabeledMergePatch(set, nil, remove...)
}

// LabeledMergePatch is MergePatch that also sets the labels in labels, and removes the previous
// release's key of each.
func LabeledMergePatch(set, labels map[string]string, remove ...string) []byte {
	values := make(map[string]any, 2*(len(set)+len(remove)))
	for _, key := range remove {
		values[key] = nil
	}
	for key, v := range set {
		values[key] = v
	}
	for _, key := range withPrevious(set, remove) {
		if _, written := values[key]; !written {
			values[key] = nil
		}
	}
	metadata := map[string]any{"annotations": values}
	if len(labels) > 0 {
		labelValues := make(map[string]any, 2*len(labels))
		for key, v := range labels {
			labelValues[key] = v
		}
		for _, key := range withPrevious(labels, nil) {
			if _, written := labelValues[key]; !written {
				labelValues[key] = nil
			}
		}
		metadata["labels"] = labelValues
	}
	// A map of strings and nils always encodes.
	body, _ := json.Marshal(map[string]any{"metadata": metadata})
	return body
}

// withPrevious returns the previous release's keys of the keys of set and of remove.
func withPrevious(set map[string]string, remove []string) []string {
	var keys []string
	for key := range set {
		if p := Previous(key); p != "" {
			keys = append(keys, p)
		}
	}
	for _, key := range remove {
		if p := Previous(key); p != "" {
			keys = append(keys, p)
		}
	}
	return keys
}

// Previous returns the key under which release 0.1.0 wrote what this release writes under key,
// or "" for a key that did not change (the csi-addons sidecar's) or is not one of this package.
// This release reads the previous keys; the next one will not.
func Previous(key string) string {
	switch key {
	case HealerRestart:
		return "healer.csiaddons.openshift.io/restarted-at"
	case Endpoint:
		return "healer.csiaddons.openshift.io/endpoint"
	case HandledMarker:
		return "healer.csiaddons.openshift.io/handled-marker"
	case Registration:
		return "healer.csiaddons.openshift.io/registration"
	case SweepRequest:
		return "healer.csiaddons.openshift.io/sweep"
	case SweepHandled:
		return "healer.csiaddons.openshift.io/sweep-handled"
	case Schedule:
		return "healer.csiaddons.openshift.io/schedule"
	case EvictPodsLabel:
		return "healer.csiaddons.openshift.io/evict-pods"
	case VolumeStatus:
		return "healer.csiaddons.openshift.io/status"
	case PolicyLabel:
		return "healer.csiaddons.openshift.io/policy"
	case PolicyStatus:
		return "healer.csiaddons.openshift.io/policy-status"
	case PolicyLastGoodRevision:
		return "healer.csiaddons.openshift.io/policy-last-good-revision"
	}
	return ""
}

// Keys returns key and, when it has one, its previous key: the keys a reader looks at, the one
// this release writes first. A label selector for key is one selector per returned key, since
// one selector cannot match either of two keys.
func Keys(key string) []string {
	if p := Previous(key); p != "" {
		return []string{key, p}
	}
	return []string{key}
}

// Get returns the value of key in m, an object's annotations or labels, and whether m carries it:
// the value under key, or, on an object that carries no value under key, the value under its
// previous key, which an object written by release 0.1.0 carries instead.
func Get(m map[string]string, key string) (string, bool) {
	for _, k := range Keys(key) {
		if v, ok := m[k]; ok {
			return v, true
		}
	}
	return "", false
}

// Value is Get without the presence: "" when m carries neither key.
func Value(m map[string]string, key string) string {
	v, _ := Get(m, key)
	return v
}
