package volumehealer_test

import data.volumehealer

pod(namespace, owner, time) := {
	"trigger": "restart",
	"volume": {
		"pv": "pvc-1",
		"handle": "0001-0009-rook-ceph-0000000000000002-1",
		"driver": "rbd.csi.ceph.com",
		"attributes": {"mounter": "rbd-nbd"},
		"mountOptions": [],
		"accessModes": ["ReadWriteOnce"],
		"storageClass": {"name": "ceph-rbd-nbd", "parameters": {}},
		"pvc": {"namespace": namespace, "name": "data", "labels": {}, "annotations": {}},
	},
	"driver": {
		"name": "rbd.csi.ceph.com",
		"identityCapabilities": [],
		"healer": {"probe": true, "heal": true, "listVolumes": false, "attributes": {}},
	},
	"history": {"consecutiveFailures": 0},
	"probe": {
		"healthy": false,
		"health": [{"status": "INACCESSIBLE", "reason": "StaleMountInPods", "message": "1 process in 1 mount namespace"}],
		"healable": true,
		"recheckAfterSeconds": 0,
	},
	"pod": {"namespace": namespace, "name": "app-0", "ownerKind": owner, "labels": {}, "disruptionBudget": false},
	"namespace": {"name": namespace, "labels": {}},
	"storageClass": {"name": "ceph-rbd-nbd", "labels": {"volume-healer.io/evict-pods": "true"}},
	"time": time,
}

test_evicts_controller_pods_elsewhere if {
	volumehealer.restart == {"action": "evict", "reason": "EvictEverywhere"} with input as pod("shop", "ReplicaSet", "2026-12-01T12:00:00Z")
}

test_evicts_without_opt_in if {
	doc := json.remove(pod("shop", "Job", "2026-12-01T12:00:00Z"), ["storageClass"])
	volumehealer.restart.action == "evict" with input as doc
}

test_leaves_the_excluded_namespace_alone if {
	volumehealer.restart == {"action": "leave", "reason": "NamespaceExcluded"} with input as pod("payments", "ReplicaSet", "2026-12-01T12:00:00Z")
}

test_leaves_bare_pods_alone if {
	volumehealer.restart == {"action": "leave", "reason": "NoController"} with input as pod("shop", "", "2026-12-01T12:00:00Z")
}

test_volumes_follow_the_builtin_policy if {
	volumehealer.decision.action == "heal" with input as pod("payments", "ReplicaSet", "2026-12-01T12:00:00Z")
}
