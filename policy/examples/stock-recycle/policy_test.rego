package volumehealer_test

import data.volumehealer

# A stock ceph-csi RBD driver: no healer service, the sidecar probes its volumes (tier none).
stock(evict) := {
	"trigger": "restart",
	"volume": {
		"pv": "pvc-4",
		"handle": "0001-0009-rook-ceph-0000000000000002-4",
		"driver": "rbd.csi.ceph.com",
		"attributes": {"mounter": "rbd-nbd"},
		"mountOptions": [],
		"accessModes": ["ReadWriteOnce"],
	},
	"attachment": {"node": "node-1", "attached": true, "detaching": false},
	"driver": {
		"name": "rbd.csi.ceph.com",
		"identityCapabilities": [],
		"healer": {"probe": true, "heal": false, "listVolumes": true, "attributes": {}},
		"tier": "none",
		"probeSource": "sidecar",
	},
	"history": {"consecutiveFailures": 0},
	"remedies": {"heal": false, "restartContainers": false, "evict": evict},
}

probed(evict, status, reason) := object.union(stock(evict), {"probe": {
	"healthy": false,
	"health": [{"status": status, "reason": reason, "message": ""}],
	"healable": false,
	"recheckAfterSeconds": 0,
}})

pod(owner, ns_labels) := object.union(probed(true, "INACCESSIBLE", "MountGone"), {
	"remedy": "recycle", "finding": "MountGone",
	"pod": {"namespace": "shop", "name": "app-0", "ownerKind": owner, "labels": {}, "disruptionBudget": true, "restartPolicy": "Always"},
	"namespace": {"name": "shop", "labels": ns_labels},
	"storageClass": {"name": "ceph-rbd-nbd", "labels": {}},
	"time": "2026-12-01T12:00:00Z",
})

test_stock_volume_is_probed if {
	volumehealer.decision.action == "probe" with input as stock(true)
}

test_dead_mount_is_recycled_where_evictions_are_on if {
	volumehealer.decision == {"action": "recycle", "reason": "RecycleAfterRestart", "priority": 100} with input as probed(true, "INACCESSIBLE", "MountGone")
	volumehealer.decision.action == "recycle" with input as probed(true, "DEGRADED", "MountHung")
}

test_without_evictions_it_says_so if {
	volumehealer.decision == {"action": "skip", "reason": "RecycleNeedsEvictions"} with input as probed(false, "INACCESSIBLE", "MountGone")
}

test_data_loss_is_left_to_a_person if {
	volumehealer.decision == {"action": "skip", "reason": "DataLoss"} with input as probed(true, "DATA_LOSS", "Corrupted")
	volumehealer.decision == {"action": "skip", "reason": "DataLoss"} with input as probed(false, "DATA_LOSS", "Corrupted")
}

test_controller_pods_are_evicted_without_a_label if {
	volumehealer.restart == {"action": "evict", "reason": "StockDriverRecycled"} with input as pod("ReplicaSet", {})
	volumehealer.restart == {"action": "evict", "reason": "StockDriverRecycled"} with input as pod("StatefulSet", {})
}

test_bare_pods_and_excluded_statefulsets_stay if {
	volumehealer.restart == {"action": "leave", "reason": "NoController"} with input as pod("", {})
	volumehealer.restart == {"action": "leave", "reason": "StatefulSetsNotEvicted"} with input as pod("StatefulSet", {"volume-healer.io/evict-statefulsets": "false"})
}

test_a_driver_that_heals_follows_the_builtin_policy if {
	healer := object.union(probed(true, "INACCESSIBLE", "MountGone"), {
		"driver": {"healer": {"heal": true}, "tier": "healer", "probeSource": "driver"},
		"remedies": {"heal": true},
		"probe": {"healable": true},
	})
	volumehealer.decision.action == "heal" with input as healer
}
