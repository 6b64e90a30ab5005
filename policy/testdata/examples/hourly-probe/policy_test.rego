package volumehealer_test

import data.volumehealer

# 2025-01-01T12:00:00Z
noon := 1735732800000000000

sweep(trigger, class, last_probe) := {
	"trigger": trigger,
	"volume": {
		"pv": "pvc-1",
		"handle": "0001-0009-rook-ceph-0000000000000002-1",
		"driver": "rbd.csi.ceph.com",
		"attributes": {"mounter": "rbd-nbd"},
		"mountOptions": [],
		"accessModes": ["ReadWriteOnce"],
		"storageClass": {"name": class, "parameters": {}},
	},
	"driver": {
		"name": "rbd.csi.ceph.com",
		"identityCapabilities": [],
		"healer": {"probe": true, "heal": true, "listVolumes": false, "attributes": {}},
	},
	"history": {
		"lastProbe": {"time": last_probe, "healthy": true, "health": []},
		"consecutiveFailures": 0,
	},
}

broken(doc) := object.union(doc, {"probe": {
	"healthy": false,
	"health": [{"status": "INACCESSIBLE", "reason": "MountGone", "message": ""}],
	"healable": true,
	"recheckAfterSeconds": 0,
}})

test_recent_probe_is_not_repeated if {
	doc := sweep("schedule", "ceph-rbd-nbd", "2025-01-01T11:30:00Z")
	volumehealer.decision == {"action": "skip", "reason": "ProbedWithinTheHour"} with input as doc with time.now_ns as noon
}

test_old_probe_is_repeated if {
	doc := sweep("schedule", "ceph-rbd-nbd", "2025-01-01T10:59:59Z")
	volumehealer.decision.action == "probe" with input as doc with time.now_ns as noon
}

test_schedule_reports_but_does_not_heal if {
	doc := broken(sweep("schedule", "ceph-rbd-nbd", "2025-01-01T11:30:00Z"))
	volumehealer.decision == {"action": "skip", "reason": "HealOnlyAfterRestart"} with input as doc with time.now_ns as noon
}

test_restart_probes_and_heals if {
	doc := sweep("restart", "ceph-rbd-nbd", "2025-01-01T11:59:00Z")
	volumehealer.decision.action == "probe" with input as doc with time.now_ns as noon
	volumehealer.decision.action == "heal" with input as broken(doc) with time.now_ns as noon
}

test_other_classes_follow_the_builtin_policy if {
	doc := sweep("schedule", "ceph-rbd", "2025-01-01T11:59:00Z")
	volumehealer.decision.action == "probe" with input as doc with time.now_ns as noon
	volumehealer.decision.action == "heal" with input as broken(doc) with time.now_ns as noon
}
