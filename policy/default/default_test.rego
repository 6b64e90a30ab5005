package volumehealer_test

import data.volumehealer

# An rbd-nbd volume on an attached node, as the controller builds it.
volume := {
	"pv": "pvc-3f2a9c1e",
	"handle": "0001-0009-rook-ceph-0000000000000002-7c1e2d3f",
	"driver": "rbd.csi.ceph.com",
	"attributes": {"mounter": "rbd-nbd", "pool": "replicapool"},
	"mountOptions": ["discard"],
	"accessModes": ["ReadWriteOnce"],
	"storageClass": {"name": "ceph-rbd-nbd", "parameters": {"mounter": "rbd-nbd"}},
	"pvc": {"namespace": "shop", "name": "orders-db", "labels": {}, "annotations": {}},
}

driver := {
	"name": "rbd.csi.ceph.com",
	"identityCapabilities": ["SERVICE:NODE_SERVICE"],
	"healer": {"probe": true, "heal": true, "listVolumes": false, "attributes": {}},
}

first(trigger) := {
	"trigger": trigger,
	"volume": volume,
	"attachment": {"node": "node-1", "attached": true, "detaching": false},
	"node": {"name": "node-1", "labels": {}},
	"driver": driver,
	"history": {"consecutiveFailures": 0},
}

second(trigger, probe) := object.union(first(trigger), {"probe": probe})

broken := {
	"healthy": false,
	"health": [{"status": "INACCESSIBLE", "reason": "MountGone", "message": "/dev/nbd0 is gone"}],
	"healable": true,
	"recheckAfterSeconds": 0,
}

test_restart_probes if {
	volumehealer.decision == {"action": "probe", "reason": "ProbeAfterRestart", "priority": 100} with input as first("restart")
}

test_manual_probes_like_restart if {
	volumehealer.decision == {"action": "probe", "reason": "ProbeRequested", "priority": 100} with input as first("manual")
}

test_schedule_probes if {
	volumehealer.decision == {"action": "probe", "reason": "ScheduledProbe", "priority": 10} with input as first("schedule")
}

test_driver_without_probe_is_skipped if {
	d := object.union(driver, {"healer": {"probe": false, "heal": false, "listVolumes": false, "attributes": {}}})
	doc := object.union(first("restart"), {"driver": d})
	volumehealer.decision == {"action": "skip", "reason": "DriverCannotProbe"} with input as doc
}

test_detaching_volume_is_skipped if {
	doc := object.union(first("restart"), {"attachment": {"node": "node-1", "attached": true, "detaching": true}})
	volumehealer.decision.action == "skip" with input as doc
}

test_unattached_volume_is_skipped if {
	doc := object.union(first("restart"), {"attachment": {"node": "node-1", "attached": false, "detaching": false}})
	volumehealer.decision == {"action": "skip", "reason": "VolumeNotAttached"} with input as doc
}

test_volume_without_attachment_is_probed if {
	doc := json.remove(first("restart"), ["attachment"])
	volumehealer.decision.action == "probe" with input as doc
}

test_restart_heals_broken_volume if {
	volumehealer.decision == {"action": "heal", "reason": "HealAfterRestart", "priority": 100} with input as second("restart", broken)
}

test_schedule_heals_broken_volume if {
	volumehealer.decision == {"action": "heal", "reason": "HealAfterScheduledProbe", "priority": 10} with input as second("schedule", broken)
}

test_healthy_volume_is_skipped if {
	healthy := {"healthy": true, "health": [], "healable": true, "recheckAfterSeconds": 0}
	volumehealer.decision == {"action": "skip", "reason": "Healthy"} with input as second("restart", healthy)
}

kept_driver := object.union(driver, {"healer": {"volumeKeeping": {"pluginRestart": true, "mounterRestart": false}}})

test_kept_volume_is_probed_after_restart if {
	doc := object.union(first("restart"), {"driver": kept_driver})
	volumehealer.decision == {"action": "probe", "reason": "ProbeAfterRestart", "priority": 100} with input as doc
}

test_kept_healthy_volume_is_confirmed if {
	kept := {"healthy": true, "health": [], "healable": true, "recheckAfterSeconds": 0, "kept": true}
	doc := object.union(second("restart", kept), {"driver": kept_driver})
	volumehealer.decision == {"action": "skip", "reason": "Kept"} with input as doc
}

test_kept_broken_volume_is_healed if {
	doc := object.union(second("restart", object.union(broken, {"kept": true})), {"driver": kept_driver})
	volumehealer.decision == {"action": "heal", "reason": "HealAfterRestart", "priority": 100} with input as doc
}

test_data_loss_is_never_healed if {
	lost := object.union(broken, {"health": [
		{"status": "INACCESSIBLE", "reason": "MountGone", "message": ""},
		{"status": "DATA_LOSS", "reason": "ImageCorrupt", "message": ""},
	]})
	every trigger in ["restart", "schedule", "manual"] {
		volumehealer.decision == {"action": "skip", "reason": "DataLoss"} with input as second(trigger, lost)
	}
}

test_unhealable_volume_is_skipped if {
	doc := second("restart", object.union(broken, {"healable": false}))
	volumehealer.decision == {"action": "skip", "reason": "NotHealable"} with input as doc
}

test_driver_without_heal_is_skipped if {
	d := object.union(driver, {"healer": {"probe": true, "heal": false, "listVolumes": false, "attributes": {}}})
	doc := object.union(second("restart", broken), {"driver": d})
	volumehealer.decision == {"action": "skip", "reason": "DriverCannotHeal"} with input as doc
}

# A pod that still sees the dead mount after the heal of the volume above.
pod_input(owner, sc_labels, ns_labels) := object.union(second("restart", stale), {
	"pod": {"namespace": "shop", "name": "orders-0", "ownerKind": owner, "labels": {"app": "orders"}, "disruptionBudget": false},
	"namespace": {"name": "shop", "labels": ns_labels},
	"storageClass": {"name": "ceph-rbd-nbd", "labels": sc_labels},
	"time": "2026-12-01T03:00:00Z",
})

stale := {
	"healthy": false,
	"health": [{"status": "INACCESSIBLE", "reason": "StaleMountInPods", "message": "1 process in 1 mount namespace"}],
	"healable": true,
	"recheckAfterSeconds": 0,
}

opted_in := {"volume-healer.io/evict-pods": "true"}

opted_in_for_0_1_0 := {"healer.csiaddons.openshift.io/evict-pods": "true"}

test_restart_left_alone_without_opt_in if {
	volumehealer.restart == {"action": "leave", "reason": "NotOptedIn"} with input as pod_input("ReplicaSet", {}, {})
}

test_restart_evicts_in_opted_in_storage_class if {
	volumehealer.restart == {"action": "evict", "reason": "StorageClassOptedIn"} with input as pod_input("StatefulSet", opted_in, {})
}

test_restart_evicts_in_opted_in_namespace if {
	volumehealer.restart == {"action": "evict", "reason": "NamespaceOptedIn"} with input as pod_input("DaemonSet", {}, opted_in)
}

test_restart_evicts_every_controller_kind if {
	every kind in {"ReplicaSet", "StatefulSet", "DaemonSet", "Job"} {
		volumehealer.restart.action == "evict" with input as pod_input(kind, opted_in, {})
	}
}

test_restart_never_evicts_a_bare_pod if {
	volumehealer.restart == {"action": "leave", "reason": "NoController"} with input as pod_input("", opted_in, opted_in)
}

test_restart_never_evicts_an_unknown_owner if {
	volumehealer.restart.action == "leave" with input as pod_input("Node", opted_in, opted_in)
}

test_restart_opt_in_needs_the_value_true if {
	volumehealer.restart.action == "leave" with input as pod_input("ReplicaSet", {"volume-healer.io/evict-pods": "yes"}, {})
}

test_restart_evicts_where_the_label_of_0_1_0_opted_in if {
	volumehealer.restart == {"action": "evict", "reason": "StorageClassOptedIn"} with input as pod_input("StatefulSet", opted_in_for_0_1_0, {})
	volumehealer.restart == {"action": "evict", "reason": "NamespaceOptedIn"} with input as pod_input("StatefulSet", {}, opted_in_for_0_1_0)
}

test_restart_the_new_label_wins_over_the_one_of_0_1_0 if {
	opted_out := {"volume-healer.io/evict-pods": "false", "healer.csiaddons.openshift.io/evict-pods": "true"}
	volumehealer.restart == {"action": "leave", "reason": "NotOptedIn"} with input as pod_input("ReplicaSet", opted_out, opted_out)
}

# The remedy ladder: a driver that serves no Healer service, whose volumes the sidecar probes.
stock_driver := object.union(driver, {
	"healer": {"probe": true, "heal": false, "listVolumes": true, "attributes": {}},
	"tier": "none",
	"probeSource": "sidecar",
})

stock(trigger, probe, remedies) := object.union(second(trigger, probe), {"driver": stock_driver, "remedies": remedies})

may_evict := {"heal": false, "restartContainers": false, "evict": true}

may_not_evict := {"heal": false, "restartContainers": false, "evict": false}

test_dead_volume_of_a_driver_that_cannot_heal_is_recycled if {
	volumehealer.decision == {"action": "recycle", "reason": "RecycleAfterRestart", "priority": 100} with input as stock("restart", broken, may_evict)
	volumehealer.decision == {"action": "recycle", "reason": "RecycleAfterScheduledProbe", "priority": 10} with input as stock("schedule", broken, may_evict)
	volumehealer.decision == {"action": "recycle", "reason": "RecycleRequested", "priority": 100} with input as stock("manual", broken, may_evict)
}

test_hung_and_read_only_volumes_are_recycled if {
	every reason in ["MountHung", "ReadOnlyMount"] {
		p := object.union(broken, {"health": [{"status": "DEGRADED", "reason": reason, "message": ""}]})
		volumehealer.decision.action == "recycle" with input as stock("restart", p, may_evict)
	}
}

test_degraded_volume_for_another_reason_is_not_recycled if {
	p := object.union(broken, {"health": [{"status": "DEGRADED", "reason": "SlowIO", "message": ""}]})
	volumehealer.decision.action == "skip" with input as stock("restart", p, may_evict)
}

test_recycle_needs_evictions_allowed if {
	volumehealer.decision == {"action": "skip", "reason": "DriverCannotHeal"} with input as stock("restart", broken, may_not_evict)
	doc := json.remove(stock("restart", broken, may_not_evict), ["remedies"])
	volumehealer.decision == {"action": "skip", "reason": "DriverCannotHeal"} with input as doc
}

test_publish_target_not_mounted_is_recycled_with_its_own_reason if {
	p := object.union(broken, {"health": [{"status": "INACCESSIBLE", "reason": "PublishTargetNotMounted", "message": ""}]})
	volumehealer.decision == {"action": "recycle", "reason": "RecyclePublishTargetNotMounted", "priority": 10} with input as stock("schedule", p, may_evict)
}

test_data_loss_is_never_recycled if {
	lost := object.union(broken, {"health": [
		{"status": "INACCESSIBLE", "reason": "PublishTargetNotMounted", "message": ""},
		{"status": "DATA_LOSS", "reason": "ImageCorrupt", "message": ""},
	]})
	volumehealer.decision == {"action": "skip", "reason": "DataLoss"} with input as stock("restart", lost, may_evict)
}

test_a_driver_that_heals_heals_rather_than_recycles if {
	doc := object.union(second("restart", broken), {"remedies": {"heal": true, "restartContainers": false, "evict": true}})
	volumehealer.decision.action == "heal" with input as doc
}

test_an_unhealable_volume_of_a_healing_driver_is_recycled if {
	doc := object.union(second("restart", object.union(broken, {"healable": false})), {"remedies": {"heal": true, "restartContainers": false, "evict": true}})
	volumehealer.decision == {"action": "recycle", "reason": "RecycleAfterRestart", "priority": 100} with input as doc
}

test_healthy_volume_of_a_stock_driver_is_skipped if {
	healthy := {"healthy": true, "health": [], "healable": false, "recheckAfterSeconds": 0}
	volumehealer.decision == {"action": "skip", "reason": "Healthy"} with input as stock("restart", healthy, may_evict)
}

# A pod asked to restart by a remedy.
remedy_pod(remedy, finding, owner, restart_policy, remedies, sc_labels) := object.union(pod_input(owner, sc_labels, {}), {
	"remedy": remedy,
	"finding": finding,
	"remedies": remedies,
	"pod": {"namespace": "shop", "name": "orders-0", "ownerKind": owner, "labels": {}, "disruptionBudget": false, "restartPolicy": restart_policy},
})

may_restart := {"heal": true, "restartContainers": true, "evict": true}

test_restart_after_heal_restarts_containers_in_place if {
	volumehealer.restart == {"action": "restartContainers", "reason": "RestartContainersInPlace"} with input as remedy_pod("heal", "StaleMountInPods", "ReplicaSet", "Always", may_restart, {})
	# A bare pod keeps its place too: nothing is deleted.
	volumehealer.restart.action == "restartContainers" with input as remedy_pod("heal", "StaleMountInPods", "", "OnFailure", may_restart, {})
}

test_restart_after_heal_without_container_restart_falls_back_to_eviction if {
	no_cri := {"heal": true, "restartContainers": false, "evict": true}
	volumehealer.restart == {"action": "evict", "reason": "StorageClassOptedIn"} with input as remedy_pod("heal", "StaleMountInPods", "ReplicaSet", "Always", no_cri, opted_in)
	volumehealer.restart == {"action": "leave", "reason": "NotOptedIn"} with input as remedy_pod("heal", "StaleMountInPods", "ReplicaSet", "Always", no_cri, {})
}

test_restart_policy_never_is_not_restarted_in_place if {
	volumehealer.restart == {"action": "evict", "reason": "StorageClassOptedIn"} with input as remedy_pod("heal", "StaleMountInPods", "Job", "Never", may_restart, opted_in)
}

test_recycle_never_restarts_containers if {
	volumehealer.restart == {"action": "evict", "reason": "StorageClassOptedIn"} with input as remedy_pod("recycle", "MountGone", "StatefulSet", "Always", may_restart, opted_in)
	volumehealer.restart == {"action": "leave", "reason": "NotOptedIn"} with input as remedy_pod("recycle", "MountGone", "StatefulSet", "Always", may_restart, {})
}

test_recycle_of_an_unmounted_publish_target_evicts_without_opt_in if {
	volumehealer.restart == {"action": "evict", "reason": "PublishTargetNotMounted"} with input as remedy_pod("recycle", "PublishTargetNotMounted", "ReplicaSet", "Always", may_evict, {})
}

test_recycle_never_evicts_a_bare_pod if {
	volumehealer.restart == {"action": "leave", "reason": "NoController"} with input as remedy_pod("recycle", "PublishTargetNotMounted", "", "Always", may_evict, opted_in)
}

propagation_opted_in := {"volume-healer.io/mount-propagation": "HostToContainer"}

new_pod(ns_labels, volumes) := {
	"pod": {"namespace": "shop", "name": "", "generateName": "web-", "ownerKind": "ReplicaSet", "labels": {}},
	"namespace": {"name": "shop", "labels": ns_labels},
	"volumes": volumes,
}

claim_volume(name, driver, sc_labels, propagation) := {
	"name": name, "claim": name, "persistentVolume": concat("-", ["pv", name]), "driver": driver,
	"storageClass": {"name": "fast", "labels": sc_labels, "parameters": {}},
	"mounts": [{"container": "app", "containerKind": "container", "mountPath": "/data", "propagation": propagation}],
}

test_propagation_sets_only_opted_in_csi_volumes if {
	volumehealer.propagation == {
		"data": {"set": true, "reason": "StorageClassOptedIn"},
		"cache": {"set": false, "reason": "NotOptedIn"},
		"nfs": {"set": false, "reason": "NotCSI"},
	} with input as new_pod({}, [
		claim_volume("data", "rbd.csi.ceph.com", propagation_opted_in, ""),
		claim_volume("cache", "rbd.csi.ceph.com", {}, "None"),
		claim_volume("nfs", "", propagation_opted_in, ""),
	])
}

test_propagation_namespace_opts_in if {
	volumehealer.propagation == {"data": {"set": true, "reason": "NamespaceOptedIn"}} with input as new_pod(propagation_opted_in, [claim_volume("data", "rbd.csi.ceph.com", {}, "None")])
}

test_propagation_leaves_set_propagations_alone if {
	every p in {"HostToContainer", "Bidirectional"} {
		volumehealer.propagation == {"data": {"set": false, "reason": "NoMountToChange"}} with input as new_pod(propagation_opted_in, [claim_volume("data", "rbd.csi.ceph.com", propagation_opted_in, p)])
	}
}

test_propagation_without_claim_volumes_decides_nothing if {
	volumehealer.propagation == {} with input as new_pod(propagation_opted_in, [])
}
