package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// TestEveryInputFieldReachesThePolicy checks, for every documented input field, that a policy
// reading it sees the value the controller put there: the condition is false for the sample
// input and becomes true once the field is changed.
func TestEveryInputFieldReachesThePolicy(t *testing.T) {
	tests := map[string]struct {
		condition string
		change    func(in *Input)
	}{
		"trigger":   {`input.trigger == "schedule"`, func(in *Input) { in.Trigger = TriggerSchedule }},
		"volume.pv": {`input.volume.pv == "pvc-other"`, func(in *Input) { in.Volume.PV = "pvc-other" }},
		"volume.handle": {`startswith(input.volume.handle, "0001-0009-other")`,
			func(in *Input) { in.Volume.Handle = "0001-0009-other-1" }},
		"volume.driver": {`input.volume.driver == "cephfs.csi.ceph.com"`,
			func(in *Input) { in.Volume.Driver = "cephfs.csi.ceph.com" }},
		"volume.attributes": {`input.volume.attributes.mounter == "fuse"`,
			func(in *Input) { in.Volume.Attributes = map[string]string{"mounter": "fuse"} }},
		"volume.mountOptions": {`"noatime" in input.volume.mountOptions`,
			func(in *Input) { in.Volume.MountOptions = append(in.Volume.MountOptions, "noatime") }},
		"volume.accessModes": {`input.volume.accessModes[0] == "ReadWriteMany"`,
			func(in *Input) { in.Volume.AccessModes = []string{"ReadWriteMany"} }},
		"volume.storageClass.name": {`input.volume.storageClass.name == "gold"`,
			func(in *Input) { in.Volume.StorageClass.Name = "gold" }},
		"volume.storageClass.parameters": {`input.volume.storageClass.parameters.pool == "ssd"`,
			func(in *Input) { in.Volume.StorageClass.Parameters = map[string]string{"pool": "ssd"} }},
		"volume.storageClass absent": {`not input.volume.storageClass`,
			func(in *Input) { in.Volume.StorageClass = nil }},
		"volume.pvc.namespace": {`input.volume.pvc.namespace == "scratch"`,
			func(in *Input) { in.Volume.PVC.Namespace = "scratch" }},
		"volume.pvc.name": {`input.volume.pvc.name == "cache"`, func(in *Input) { in.Volume.PVC.Name = "cache" }},
		"volume.pvc.labels": {`input.volume.pvc.labels["volume-healer.io/skip"] == "true"`,
			func(in *Input) { in.Volume.PVC.Labels["volume-healer.io/skip"] = "true" }},
		"volume.pvc.annotations": {`input.volume.pvc.annotations.owner == "team-b"`,
			func(in *Input) { in.Volume.PVC.Annotations["owner"] = "team-b" }},
		"volume.pvc absent when unbound": {`not input.volume.pvc`, func(in *Input) { in.Volume.PVC = nil }},
		"attachment.node":                {`input.attachment.node == "node-2"`, func(in *Input) { in.Attachment.Node = "node-2" }},
		"attachment.attached": {`input.attachment.attached == false`,
			func(in *Input) { in.Attachment.Attached = false }},
		"attachment.detaching": {`input.attachment.detaching`, func(in *Input) { in.Attachment.Detaching = true }},
		"attachment absent":    {`not input.attachment`, func(in *Input) { in.Attachment = nil }},
		"node.name":            {`input.node.name == "node-2"`, func(in *Input) { in.Node.Name = "node-2" }},
		"node.labels": {`input.node.labels["topology.kubernetes.io/zone"] == "b"`,
			func(in *Input) { in.Node.Labels = map[string]string{"topology.kubernetes.io/zone": "b"} }},
		"driver.name": {`input.driver.name == "cephfs.csi.ceph.com"`,
			func(in *Input) { in.Driver.Name = "cephfs.csi.ceph.com" }},
		"driver.identityCapabilities": {`"SERVICE:CONTROLLER_SERVICE" in input.driver.identityCapabilities`,
			func(in *Input) { in.Driver.IdentityCapabilities = []string{"SERVICE:CONTROLLER_SERVICE"} }},
		"driver.tier": {`input.driver.tier == "none"`,
			func(in *Input) { in.Driver.Tier = TierNone }},
		"driver.probeSource": {`input.driver.probeSource == "sidecar"`,
			func(in *Input) { in.Driver.ProbeSource = "sidecar" }},
		"driver.healer.probe": {`input.driver.healer.probe == false`,
			func(in *Input) { in.Driver.Healer.Probe = false }},
		"driver.healer.heal": {`input.driver.healer.heal == false`, func(in *Input) { in.Driver.Healer.Heal = false }},
		"driver.healer.listVolumes": {`input.driver.healer.listVolumes`,
			func(in *Input) { in.Driver.Healer.ListVolumes = true }},
		"driver.healer.attributes": {`input.driver.healer.attributes.healMounters == "rbd-nbd,fuse"`,
			func(in *Input) { in.Driver.Healer.Attributes = map[string]string{"healMounters": "rbd-nbd,fuse"} }},
		"history.lastProbe.time": {`time.parse_rfc3339_ns(input.history.lastProbe.time) == 1735732800000000000`,
			func(in *Input) { in.History.LastProbe.Time = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC) }},
		"history.lastProbe.healthy": {`input.history.lastProbe.healthy == false`,
			func(in *Input) { in.History.LastProbe.Healthy = false }},
		"history.lastProbe.health": {`input.history.lastProbe.health[_].reason == "ReadOnly"`,
			func(in *Input) {
				in.History.LastProbe.Health = []Health{{Status: HealthDegraded, Reason: "ReadOnly"}}
			}},
		"history.lastProbe absent": {`not input.history.lastProbe`, func(in *Input) { in.History.LastProbe = nil }},
		"history.consecutiveFailures": {`input.history.consecutiveFailures >= 3`,
			func(in *Input) { in.History.ConsecutiveFailures = 3 }},
		"history.lastHeal": {`input.history.lastHeal == "2025-01-02T02:04:05.5Z"`,
			func(in *Input) {
				t := time.Date(2025, 1, 2, 3, 4, 5, 500_000_000, time.FixedZone("CET", 3600)).UTC()
				in.History.LastHeal = &t
			}},
		"history.lastHeal absent": {`not input.history.lastHeal`, func(in *Input) { in.History.LastHeal = nil }},
		"probe present":           {`input.probe`, func(in *Input) { in.Probe = brokenProbe() }},
		"probe.healthy":           {`input.probe.healthy == false`, func(in *Input) { in.Probe = brokenProbe() }},
		"probe.health.status": {`input.probe.health[_].status == "INACCESSIBLE"`,
			func(in *Input) { in.Probe = brokenProbe() }},
		"probe.health.reason": {`input.probe.health[0].reason == "MountGone"`,
			func(in *Input) { in.Probe = brokenProbe() }},
		"probe.health.message": {`contains(input.probe.health[_].message, "nbd0")`,
			func(in *Input) { in.Probe = brokenProbe() }},
		"probe.healable": {`input.probe.healable`, func(in *Input) { in.Probe = brokenProbe() }},
		"probe.recheckAfterSeconds": {`input.probe.recheckAfterSeconds == 30`,
			func(in *Input) { in.Probe = brokenProbe(); in.Probe.RecheckAfterSeconds = 30 }},
	}
	ctx := context.Background()
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			text := policyText(
				`default decision := {"action": "skip", "reason": "condition false"}`,
				`decision := {"action": "probe", "reason": "condition true"} if {`,
				"\t"+tc.condition,
				`}`,
			)
			for _, memo := range []bool{true, false} {
				rev := mustCompile(t, "field.rego", text, CompileOptions{DisableMemo: !memo})
				base := sampleInput()
				changed := sampleInput()
				tc.change(&changed)
				for _, c := range []struct {
					in   Input
					want Action
				}{{base, ActionSkip}, {changed, ActionProbe}, {base, ActionSkip}} {
					d, err := rev.Decide(ctx, &c.in)
					if err != nil {
						t.Fatalf("memo=%t: %v", memo, err)
					}
					if d.Action != c.want {
						t.Errorf("memo=%t: decision %+v, want action %s (condition %s)", memo, d, c.want, tc.condition)
					}
				}
			}
		})
	}
}

// TestInputJSONIsWhatThePolicySees checks that the JSON form of the input (what `healerctl policy
// eval` reads and the docs describe) equals the Rego value the engine evaluates, and survives a
// round trip.
func TestInputJSONIsWhatThePolicySees(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	inputs := []Input{sampleInput(), {Trigger: TriggerManual}}
	for range 300 {
		inputs = append(inputs, randomInput(r))
	}
	for i, in := range inputs {
		b, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		fromJSON, err := ast.ValueFromReader(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if fromJSON.Compare(in.astValue()) != 0 {
			t.Fatalf("input %d: JSON %s differs from the Rego value %v", i, b, in.astValue())
		}
		var back Input
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("input %d: decoding %s: %v", i, b, err)
		}
		if back.astValue().Compare(in.astValue()) != 0 {
			t.Fatalf("input %d: round trip changed %v into %v", i, in.astValue(), back.astValue())
		}
	}
}

func TestUnknownTriggerIsRejected(t *testing.T) {
	rev := mustCompile(t, "p.rego", policyText(`decision := {"action": "skip", "reason": "r"}`), CompileOptions{})
	in := sampleInput()
	in.Trigger = "reboot"
	if _, err := rev.Decide(context.Background(), &in); err == nil || !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("Decide with trigger %q: %v, want ErrInvalidInput", in.Trigger, err)
	}
}
