package volumehealer_test

import data.volumehealer

claim(namespace, labels) := {
	"trigger": "restart",
	"volume": {
		"pv": "pvc-1",
		"handle": "0001-0009-rook-ceph-0000000000000002-1",
		"driver": "rbd.csi.ceph.com",
		"attributes": {"mounter": "rbd-nbd"},
		"mountOptions": [],
		"accessModes": ["ReadWriteOnce"],
		"pvc": {"namespace": namespace, "name": "data", "labels": labels, "annotations": {}},
	},
	"driver": {
		"name": "rbd.csi.ceph.com",
		"identityCapabilities": [],
		"healer": {"probe": true, "heal": true, "listVolumes": false, "attributes": {}},
	},
	"history": {"consecutiveFailures": 0},
}

test_scratch_namespace_is_skipped if {
	volumehealer.decision == {"action": "skip", "reason": "NamespaceOptedOut"} with input as claim("scratch", {})
}

test_labelled_claim_is_skipped if {
	labels := {"volume-healer.io/skip": "true"}
	volumehealer.decision == {"action": "skip", "reason": "ClaimOptedOut"} with input as claim("shop", labels)
}

test_label_must_say_true if {
	labels := {"volume-healer.io/skip": "false"}
	volumehealer.decision.action == "probe" with input as claim("shop", labels)
}

test_other_namespaces_follow_the_builtin_policy if {
	volumehealer.decision.action == "probe" with input as claim("shop", {})
}

test_unbound_volume_follows_the_builtin_policy if {
	doc := json.remove(claim("shop", {}), ["volume/pvc"])
	volumehealer.decision.action == "probe" with input as doc
}
