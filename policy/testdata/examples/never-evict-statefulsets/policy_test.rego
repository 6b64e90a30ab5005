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

test_statefulset_pods_are_left_alone if {
	volumehealer.restart == {"action": "leave", "reason": "StatefulSetLeftAlone"} with input as pod("shop", "StatefulSet", "2026-12-01T12:00:00Z")
}

test_other_controller_pods_follow_the_builtin_policy if {
	volumehealer.restart == {"action": "evict", "reason": "StorageClassOptedIn"} with input as pod("shop", "ReplicaSet", "2026-12-01T12:00:00Z")
}

test_builtin_opt_in_still_applies if {
	doc := json.remove(pod("shop", "DaemonSet", "2026-12-01T12:00:00Z"), ["storageClass"])
	volumehealer.restart == {"action": "leave", "reason": "NotOptedIn"} with input as doc
}
