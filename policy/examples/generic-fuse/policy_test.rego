package volumehealer_test

import data.volumehealer

fuse(driver, heal) := {
	"trigger": "restart",
	"volume": {
		"pv": "pvc-3",
		"handle": "bucket-photos",
		"driver": driver,
		"attributes": {},
		"mountOptions": [],
		"accessModes": ["ReadWriteMany"],
	},
	"attachment": {"node": "node-1", "attached": true, "detaching": false},
	"driver": {
		"name": driver,
		"identityCapabilities": [],
		"healer": {"probe": true, "heal": heal, "listVolumes": false, "attributes": {}},
		"tier": "healer",
	},
	"history": {"consecutiveFailures": 0},
	"remedies": {"heal": heal, "restartContainers": false, "evict": true},
}

gone(healable) := {
	"healthy": false,
	"health": [{"status": "INACCESSIBLE", "reason": "MountGone", "message": "transport endpoint is not connected"}],
	"healable": healable,
	"recheckAfterSeconds": 0,
}

test_listed_driver_is_probed_and_healed if {
	volumehealer.decision.action == "probe" with input as fuse("fuse.csi.example.com", true)
	volumehealer.decision.action == "heal" with input as object.union(fuse("fuse.csi.example.com", true), {"probe": gone(true)})
}

test_unhealable_volume_is_recycled if {
	volumehealer.decision == {"action": "recycle", "reason": "RecycleAfterRestart", "priority": 100} with input as object.union(fuse("fuse.csi.example.com", true), {"probe": gone(false)})
}

test_driver_not_listed_is_never_touched if {
	volumehealer.decision == {"action": "skip", "reason": "NotAFuseDriver"} with input as fuse("rbd.csi.ceph.com", true)
	volumehealer.decision == {"action": "skip", "reason": "NotAFuseDriver"} with input as object.union(fuse("rbd.csi.ceph.com", true), {"probe": gone(true)})
}

test_pods_of_a_driver_not_listed_are_left_alone if {
	pod_input := object.union(object.union(fuse("rbd.csi.ceph.com", true), {"probe": gone(true)}), {
		"remedy": "heal", "finding": "MountGone",
		"pod": {"namespace": "shop", "name": "app-0", "ownerKind": "StatefulSet", "labels": {}, "disruptionBudget": false, "restartPolicy": "Always"},
		"namespace": {"name": "shop", "labels": {"volume-healer.io/evict-pods": "true"}},
		"time": "2026-12-01T12:00:00Z",
	})
	volumehealer.restart == {"action": "leave", "reason": "NotAFuseDriver"} with input as pod_input
}
