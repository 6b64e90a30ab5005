package volumehealer_test

import data.volumehealer

# CephFS has no attach step: no attachment in the input.
cephfs(attributes) := {
	"trigger": "schedule",
	"volume": {
		"pv": "pvc-2",
		"handle": "0001-0009-rook-ceph-0000000000000001-2",
		"driver": "cephfs.csi.ceph.com",
		"attributes": attributes,
		"mountOptions": [],
		"accessModes": ["ReadWriteMany"],
	},
	"node": {"name": "node-1", "labels": {}},
	"driver": {
		"name": "cephfs.csi.ceph.com",
		"identityCapabilities": [],
		"healer": {"probe": true, "heal": true, "listVolumes": true, "attributes": {}},
		"tier": "healer",
	},
	"history": {"consecutiveFailures": 0},
	"remedies": {"heal": true, "restartContainers": false, "evict": true},
}

stale := {
	"healthy": false,
	"health": [{"status": "INACCESSIBLE", "reason": "StaleMountInPods", "message": "2 processes in 1 mount namespace"}],
	"healable": true,
	"recheckAfterSeconds": 0,
}

restart_input(ns_labels) := object.union(object.union(cephfs({"mounter": "fuse"}), {"probe": stale}), {
	"remedy": "heal",
	"finding": "StaleMountInPods",
	"pod": {"namespace": "media", "name": "web-7d9f-abcde", "ownerKind": "ReplicaSet", "labels": {}, "disruptionBudget": false, "restartPolicy": "Always"},
	"namespace": {"name": "media", "labels": ns_labels},
	"storageClass": {"name": "cephfs-fuse", "labels": {}},
	"time": "2026-12-01T12:00:00Z",
})

test_ceph_fuse_is_probed_without_an_attachment if {
	volumehealer.decision == {"action": "probe", "reason": "ScheduledProbe", "priority": 10} with input as cephfs({"mounter": "fuse"})
}

test_ceph_fuse_is_healed if {
	volumehealer.decision == {"action": "heal", "reason": "HealAfterScheduledProbe", "priority": 10} with input as object.union(cephfs({"mounter": "fuse"}), {"probe": stale})
}

test_kernel_client_is_skipped if {
	volumehealer.decision == {"action": "skip", "reason": "KernelMounter"} with input as cephfs({"fsName": "myfs"})
	volumehealer.decision == {"action": "skip", "reason": "KernelMounter"} with input as cephfs({"mounter": "kernel"})
}

test_pods_are_evicted_only_where_opted_in if {
	volumehealer.restart == {"action": "leave", "reason": "NotOptedIn"} with input as restart_input({})
	volumehealer.restart == {"action": "evict", "reason": "NamespaceOptedIn"} with input as restart_input({"volume-healer.io/evict-pods": "true"})
}
