# The built-in policy of volume-healer.
#
# It serves when no policy ConfigMap exists (decision.rego routes data.volumehealer.decision here),
# and every policy can fall back to it as data.volumehealer.builtin.decision.
#
# The controller evaluates the policy up to twice per volume: first without a probe result (probe
# or skip?), then, after a probe, with input.probe set (heal, recycle or skip?). docs/policy.md
# explains every rule.
package volumehealer.builtin

default decision := {"action": "skip", "reason": "NoRuleMatched"}

decision := first_pass if not probed

decision := second_pass if probed

# probed is true in the second evaluation. It tests input.probe.healthy rather than input.probe as a
# whole: the engine memoizes decisions by the input fields a policy reads, and probe messages
# differ from volume to volume.
probed if is_boolean(input.probe.healthy)

# First pass: probe every attached volume of a driver that can probe.
first_pass := skip("DriverCannotProbe") if {
	not input.driver.healer.probe
} else := skip("VolumeDetaching") if {
	input.attachment.detaching
} else := skip("VolumeNotAttached") if {
	input.attachment.attached == false
} else := {
	"action": "probe",
	"reason": probe_reason[input.trigger],
	"priority": priority[input.trigger],
}

# Second pass, the remedy ladder, least disruptive first: heal a broken volume in place when the
# driver says it can; otherwise recycle it on its node (evict the pods that use it there, so that
# kubelet unstages it and the driver's own NodeStage mounts it again) when the probe found it dead,
# hung, read-only or not mounted and the controller may evict; never when data may be lost.
second_pass := skip("Kept") if {
	# The driver kept the volume alive across the restart (its mounter runs outside the node
	# plugin) and the probe confirms it works: confirmed, nothing to heal. A kept volume that is
	# broken anyway falls through to the rules below and is healed like any other.
	input.probe.healthy
	input.probe.kept
} else := skip("Healthy") if {
	input.probe.healthy
} else := skip("DataLoss") if {
	# A volume that may have lost data needs a human: healing could make it worse.
	input.probe.health[_].status == "DATA_LOSS"
} else := {
	"action": "heal",
	"reason": heal_reason[input.trigger],
	"priority": priority[input.trigger],
} if {
	input.probe.healable
	input.driver.healer.heal
	not input.attachment.detaching
} else := skip("VolumeDetaching") if {
	input.attachment.detaching
} else := {
	# Kubelet still has a publish target published that is no longer a mount: pods with
	# HostToContainer propagation write into the node's own disk. Data is going to the wrong place.
	"action": "recycle",
	"reason": "RecyclePublishTargetNotMounted",
	"priority": priority[input.trigger],
} if {
	input.probe.health[_].reason == "PublishTargetNotMounted"
	input.remedies.evict
} else := {
	"action": "recycle",
	"reason": recycle_reason[input.trigger],
	"priority": priority[input.trigger],
} if {
	recyclable
	input.remedies.evict
} else := skip("NotHealable") if {
	not input.probe.healable
} else := skip("DriverCannotHeal") if {
	not input.driver.healer.heal
} else := skip("VolumeDetaching") if {
	input.attachment.detaching
} else := {
	"action": "heal",
	"reason": heal_reason[input.trigger],
	"priority": priority[input.trigger],
}

# A node plugin restart (or an operator) comes before routine checks.
priority := {"restart": 100, "manual": 100, "schedule": 10}

probe_reason := {"restart": "ProbeAfterRestart", "manual": "ProbeRequested", "schedule": "ScheduledProbe"}

heal_reason := {"restart": "HealAfterRestart", "manual": "HealRequested", "schedule": "HealAfterScheduledProbe"}

recycle_reason := {"restart": "RecycleAfterRestart", "manual": "RecycleRequested", "schedule": "RecycleAfterScheduledProbe"}

# recyclable is true when the probe found what a fresh NodeStage and NodePublish repair: a dead or
# missing mount (INACCESSIBLE), a hung one, or one that turned read-only.
recyclable if input.probe.health[_].status == "INACCESSIBLE"

recyclable if input.probe.health[_].reason in {"MountHung", "ReadOnlyMount"}

skip(reason) := {"action": "skip", "reason": reason}

# Restart: asked once per pod that a remedy needs restarted (input.pod set; input.time is now;
# input.remedy says which remedy asks, input.finding the probe's reason):
# - remedy "heal": the heal repaired the node's mount but the pod still sees the dead one (its mount
#   propagation is None). Restart its containers in place where the node's sidecar can
#   (input.remedies.restartContainers: the chart granted it the container runtime) and the pod's
#   containers are started again (restartPolicy not Never); otherwise evict, as below.
# - remedy "recycle": the volume is remounted only once every pod using it on the node is gone, so
#   a container restart does not help: evict, as below; for a publish target that is no longer a
#   mount (data going to the node's own disk) evict even without the opt-in label.
# Evict only pods that a controller recreates, and only where the StorageClass or the namespace
# opted in with the label volume-healer.io/evict-pods: "true" (or, where that label is not set,
# with the label of volume-healer 0.1.0, healer.csiaddons.openshift.io/evict-pods: "true"; the
# release after this one reads only the new label). A bare pod is never evicted: nothing would
# recreate it.
default restart := {"action": "leave", "reason": "NotOptedIn"}

restart := {"action": "restartContainers", "reason": "RestartContainersInPlace"} if {
	input.remedy == "heal"
	input.remedies.restartContainers
	input.pod.restartPolicy != "Never"
} else := leave("NoController") if {
	not restartable_owner[input.pod.ownerKind]
} else := {"action": "evict", "reason": "StorageClassOptedIn"} if {
	opted_in(input.storageClass.labels)
} else := {"action": "evict", "reason": "NamespaceOptedIn"} if {
	opted_in(input.namespace.labels)
} else := {"action": "evict", "reason": "PublishTargetNotMounted"} if {
	input.remedy == "recycle"
	input.finding == "PublishTargetNotMounted"
}

restartable_owner := {"ReplicaSet", "StatefulSet", "DaemonSet", "Job"}

evict_pods_label := "volume-healer.io/evict-pods"

previous_evict_pods_label := "healer.csiaddons.openshift.io/evict-pods"

opted_in(labels) if object.get(labels, evict_pods_label, object.get(labels, previous_evict_pods_label, "")) == "true"

leave(reason) := {"action": "leave", "reason": reason}

# Propagation: asked by the propagation admission webhook (propagationWebhook.enabled) once per
# pod being created, for its volumes that name a claim. Set mountPropagation HostToContainer only
# on CSI volumes, and only where the StorageClass or the namespace opted in with the label
# volume-healer.io/mount-propagation: "HostToContainer". The webhook changes only mounts whose
# propagation is unset or None: it never downgrades Bidirectional.
propagation[v.name] := mount_propagation(v) if some v in input.volumes

mount_propagation(v) := keep("NotCSI") if {
	v.driver == ""
} else := keep("NoMountToChange") if {
	not changeable_mount(v)
} else := {"set": true, "reason": "StorageClassOptedIn"} if {
	propagation_opted_in(object.get(v, ["storageClass", "labels"], {}))
} else := {"set": true, "reason": "NamespaceOptedIn"} if {
	propagation_opted_in(input.namespace.labels)
} else := keep("NotOptedIn")

changeable_mount(v) if {
	some m in v.mounts
	m.propagation in {"", "None"}
}

mount_propagation_label := "volume-healer.io/mount-propagation"

propagation_opted_in(labels) if labels[mount_propagation_label] == "HostToContainer"

keep(reason) := {"set": false, "reason": reason}
