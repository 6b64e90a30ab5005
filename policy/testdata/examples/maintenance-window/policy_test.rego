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

test_evicts_inside_the_window if {
	volumehealer.restart == {"action": "evict", "reason": "StorageClassOptedIn"} with input as pod("shop", "ReplicaSet", "2026-12-01T03:30:00Z")
}

test_window_starts_at_one if {
	volumehealer.restart.action == "evict" with input as pod("shop", "ReplicaSet", "2026-12-01T01:00:00Z")
}

test_window_ends_before_five if {
	volumehealer.restart == {"action": "leave", "reason": "OutsideMaintenanceWindow"} with input as pod("shop", "ReplicaSet", "2026-12-01T05:00:00Z")
}

test_leaves_pods_alone_by_day if {
	volumehealer.restart == {"action": "leave", "reason": "OutsideMaintenanceWindow"} with input as pod("shop", "ReplicaSet", "2026-12-01T14:00:00Z")
}

test_bare_pods_stay_alone_in_the_window if {
	volumehealer.restart == {"action": "leave", "reason": "NoController"} with input as pod("shop", "", "2026-12-01T03:30:00Z")
}
