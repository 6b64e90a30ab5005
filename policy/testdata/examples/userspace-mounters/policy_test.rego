package volumehealer_test

import data.volumehealer

volume(attributes) := {
	"trigger": "restart",
	"volume": {
		"pv": "pvc-1",
		"handle": "0001-0009-rook-ceph-0000000000000002-1",
		"driver": "rbd.csi.ceph.com",
		"attributes": attributes,
		"mountOptions": [],
		"accessModes": ["ReadWriteOnce"],
	},
	"driver": {
		"name": "rbd.csi.ceph.com",
		"identityCapabilities": [],
		"healer": {"probe": true, "heal": true, "listVolumes": false, "attributes": {}},
	},
	"history": {"consecutiveFailures": 0},
}

test_rbd_nbd_is_probed if {
	volumehealer.decision.action == "probe" with input as volume({"mounter": "rbd-nbd"})
}

test_ceph_fuse_is_probed if {
	volumehealer.decision.action == "probe" with input as volume({"mounter": "fuse"})
}

test_krbd_is_skipped if {
	volumehealer.decision == {"action": "skip", "reason": "KernelMounter"} with input as volume({"pool": "replicapool"})
}

test_cephfs_kernel_client_is_skipped if {
	volumehealer.decision.reason == "KernelMounter" with input as volume({"mounter": "kernel"})
}

test_broken_rbd_nbd_is_healed if {
	broken := object.union(volume({"mounter": "rbd-nbd"}), {"probe": {
		"healthy": false,
		"health": [{"status": "INACCESSIBLE", "reason": "MountGone", "message": ""}],
		"healable": true,
		"recheckAfterSeconds": 0,
	}})
	volumehealer.decision.action == "heal" with input as broken
}
