package volumehealer_test

import data.volumehealer

volume(trigger) := {
	"trigger": trigger,
	"volume": {
		"pv": "pvc-5",
		"handle": "0001-0009-rook-ceph-0000000000000002-5",
		"driver": "rbd.csi.ceph.com",
		"attributes": {"mounter": "rbd-nbd"},
		"mountOptions": [],
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
	"remedies": {"heal": true, "restartContainers": true, "evict": true},
}

with_probe(base, healthy, status, reason, healable) := object.union(base, {"probe": {
	"healthy": healthy,
	"health": [{"status": status, "reason": reason, "message": ""} | not healthy],
	"healable": healable,
	"recheckAfterSeconds": 0,
}})

test_volumes_are_probed if {
	volumehealer.decision.action == "probe" with input as volume("restart")
	volumehealer.decision.action == "probe" with input as volume("schedule")
	volumehealer.decision.action == "probe" with input as volume("manual")
}

test_nothing_is_healed_or_recycled if {
	every finding in [["INACCESSIBLE", "MountGone", true], ["INACCESSIBLE", "MountGone", false], ["DEGRADED", "MountHung", false], ["INACCESSIBLE", "PublishTargetNotMounted", false]] {
		volumehealer.decision == {"action": "skip", "reason": "ProbeOnly"} with input as with_probe(volume("restart"), false, finding[0], finding[1], finding[2])
	}
}

test_healthy_volume_is_skipped if {
	volumehealer.decision == {"action": "skip", "reason": "Healthy"} with input as with_probe(volume("schedule"), true, "", "", true)
}

test_no_pod_is_restarted_or_evicted if {
	pod_input := object.union(with_probe(volume("restart"), false, "INACCESSIBLE", "StaleMountInPods", true), {
		"remedy": "heal", "finding": "StaleMountInPods",
		"pod": {"namespace": "shop", "name": "app-0", "ownerKind": "ReplicaSet", "labels": {}, "disruptionBudget": false, "restartPolicy": "Always"},
		"namespace": {"name": "shop", "labels": {"volume-healer.io/evict-pods": "true"}},
		"storageClass": {"name": "ceph-rbd-nbd", "labels": {"volume-healer.io/evict-pods": "true"}},
		"time": "2026-12-01T12:00:00Z",
	})
	volumehealer.restart == {"action": "leave", "reason": "ProbeOnly"} with input as pod_input
	volumehealer.restart == {"action": "leave", "reason": "ProbeOnly"} with input as object.union(pod_input, {"remedy": "recycle", "finding": "PublishTargetNotMounted"})
}

test_no_propagation_rule if {
	not volumehealer.propagation
}
