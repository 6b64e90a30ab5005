package volumehealer_test

import data.volumehealer

rbd(attributes) := {
	"trigger": "restart",
	"volume": {
		"pv": "pvc-1",
		"handle": "0001-0009-rook-ceph-0000000000000002-1",
		"driver": "rbd.csi.ceph.com",
		"attributes": attributes,
		"mountOptions": ["discard"],
		"accessModes": ["ReadWriteOnce"],
	},
	"attachment": {"node": "node-1", "attached": true, "detaching": false},
	"driver": {
		"name": "rbd.csi.ceph.com",
		"identityCapabilities": [],
		"healer": {"probe": true, "heal": true, "listVolumes": false, "attributes": {}},
		"tier": "healer",
	},
	"history": {"consecutiveFailures": 0},
	"remedies": {"heal": true, "restartContainers": false, "evict": false},
}

dead := {
	"healthy": false,
	"health": [{"status": "INACCESSIBLE", "reason": "MountGone", "message": "transport endpoint is not connected"}],
	"healable": true,
	"recheckAfterSeconds": 0,
}

test_rbd_nbd_is_probed_after_a_restart if {
	volumehealer.decision == {"action": "probe", "reason": "ProbeAfterRestart", "priority": 100} with input as rbd({"mounter": "rbd-nbd"})
}

test_dead_rbd_nbd_mount_is_healed if {
	volumehealer.decision.action == "heal" with input as object.union(rbd({"mounter": "rbd-nbd"}), {"probe": dead})
}

test_krbd_is_skipped if {
	volumehealer.decision == {"action": "skip", "reason": "KernelMounter"} with input as rbd({"pool": "replicapool"})
	volumehealer.decision == {"action": "skip", "reason": "KernelMounter"} with input as rbd({"mounter": "krbd"})
}

test_krbd_is_skipped_even_when_reported_broken if {
	volumehealer.decision.reason == "KernelMounter" with input as object.union(rbd({}), {"probe": dead})
}

test_other_drivers_follow_the_builtin_policy if {
	other := object.union(rbd({}), {"volume": {"driver": "ebs.csi.aws.com"}, "driver": {"name": "ebs.csi.aws.com", "healer": {"probe": false, "heal": false}}})
	volumehealer.decision == {"action": "skip", "reason": "DriverCannotProbe"} with input as other
}
