package policy

import (
	"fmt"
	"time"

	"github.com/volume-healer/volume-healer/api/annotations"
)

// cannedInput is one input a new revision must decide for before it serves.
type cannedInput struct {
	name  string
	input Input
}

// validationInputs returns inputs that walk a policy through its usual branches: every trigger,
// first and second evaluation (healthy, broken, broken and unhealable, data loss), a driver that
// advertises everything and one that advertises nothing, a block volume with attachment and PVC
// and a shared filesystem volume without either. A policy that errs, conflicts, returns a
// malformed or undefined decision, or runs past the timeout on any of them is rejected.
func validationInputs() []cannedInput {
	lastProbe := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	volumes := []struct {
		name       string
		volume     Volume
		attachment *Attachment
	}{
		{
			name: "an attached rbd-nbd volume",
			volume: Volume{
				PV:           "pvc-validation-rbd",
				Handle:       "0001-0009-rook-ceph-0000000000000002-validation",
				Driver:       "rbd.csi.ceph.com",
				Attributes:   map[string]string{"mounter": "rbd-nbd", "pool": "replicapool"},
				MountOptions: []string{"discard"},
				AccessModes:  []string{"ReadWriteOnce"},
				StorageClass: &StorageClass{Name: "ceph-rbd-nbd", Parameters: map[string]string{"mounter": "rbd-nbd"}},
				PVC: &Claim{Namespace: "default", Name: "data",
					Labels: map[string]string{"app": "db"}, Annotations: map[string]string{}},
			},
			attachment: &Attachment{Node: "node-1", Attached: true},
		},
		{
			name: "an unbound ceph-fuse volume without attachment",
			volume: Volume{
				PV:          "pvc-validation-cephfs",
				Handle:      "0001-0009-rook-ceph-0000000000000001-validation",
				Driver:      "cephfs.csi.ceph.com",
				Attributes:  map[string]string{"mounter": "fuse"},
				AccessModes: []string{"ReadWriteMany"},
			},
		},
	}
	drivers := []struct {
		name   string
		driver DriverInfo
	}{
		{name: "a driver that probes and heals", driver: DriverInfo{
			Name:                 "rbd.csi.ceph.com",
			IdentityCapabilities: []string{"SERVICE:NODE_SERVICE"},
			Healer:               HealerCapabilities{Probe: true, Heal: true, ListVolumes: true, Attributes: map[string]string{"healMounters": "rbd-nbd"}},
		}},
		{name: "a driver without healer capabilities", driver: DriverInfo{Name: "ebs.csi.aws.com"}},
	}
	probes := []struct {
		name  string
		probe *ProbeResult
	}{
		{name: "before probing"},
		{name: "after a healthy probe", probe: &ProbeResult{Healthy: true, Healable: true}},
		{name: "after a probe found it inaccessible", probe: &ProbeResult{Healable: true,
			Health: []Health{{Status: HealthInaccessible, Reason: "MountGone", Message: "the mount is gone"}}}},
		{name: "after a probe found it degraded and unhealable", probe: &ProbeResult{RecheckAfterSeconds: 30,
			Health: []Health{{Status: HealthDegraded, Reason: "ReadOnly", Message: "remounted read-only"}}}},
		{name: "after a probe found data loss", probe: &ProbeResult{Healable: true,
			Health: []Health{{Status: HealthDataLoss, Reason: "Corrupt", Message: "the image is corrupt"}}}},
	}

	var out []cannedInput
	for _, trigger := range []Trigger{TriggerRestart, TriggerSchedule, TriggerManual} {
		for _, v := range volumes {
			for _, d := range drivers {
				for _, p := range probes {
					in := Input{
						Trigger:    trigger,
						Volume:     v.volume,
						Attachment: v.attachment,
						Driver:     d.driver,
						Probe:      p.probe,
					}
					if v.attachment != nil {
						in.Node = &Node{Name: v.attachment.Node, Labels: map[string]string{"kubernetes.io/hostname": v.attachment.Node}}
						in.History = History{
							LastProbe:           &ProbeRecord{Time: lastProbe, Healthy: true},
							ConsecutiveFailures: 1,
						}
					}
					out = append(out, cannedInput{
						name:  fmt.Sprintf("a %s sweep of %s of %s %s", trigger, v.name, d.name, p.name),
						input: in,
					})
				}
			}
		}
	}
	return out
}

// restartCanned is a restart input the restart rule must decide before a revision serves.
type restartCanned struct {
	name  string
	input RestartInput
}

// restartValidationInputs returns restart inputs through the usual branches: a controller's pod
// and a bare one, opted in by its StorageClass, by its namespace, or not at all.
func restartValidationInputs() []restartCanned {
	base := validationInputs()[0].input
	base.Probe = &ProbeResult{Healable: true, Health: []Health{{Status: HealthInaccessible, Reason: "StaleMountInPods", Message: "1 process in 1 mount namespace"}}}
	optIn := map[string]string{annotations.EvictPodsLabel: "true"}
	at := time.Date(2026, 1, 1, 3, 0, 0, 0, time.UTC)
	var out []restartCanned
	for _, remedy := range []string{RemedyHeal, RemedyRecycle} {
		for _, owner := range []string{"ReplicaSet", ""} {
			for _, o := range []struct {
				name     string
				ns, sc   map[string]string
				hasClass bool
			}{
				{"not opted in", nil, nil, true},
				{"its StorageClass opted in", nil, optIn, true},
				{"its namespace opted in, no StorageClass", optIn, nil, false},
			} {
				in := RestartInput{Input: base, Time: at, Remedy: remedy, Finding: FindingOf(base.Probe),
					Pod:       Pod{Namespace: "shop", Name: "app-0", OwnerKind: owner, Labels: map[string]string{"app": "shop"}, RestartPolicy: "Always"},
					Namespace: Labeled{Name: "shop", Labels: o.ns},
				}
				if o.hasClass {
					in.StorageClass = &Labeled{Name: "fast", Labels: o.sc}
				}
				kind := "a bare pod"
				if owner != "" {
					kind = "a " + owner + "'s pod"
				}
				out = append(out, restartCanned{name: "remedy " + remedy + ", " + kind + ", " + o.name, input: in})
			}
		}
	}
	return out
}

// propagationCanned is a pod being created that the propagation rule must decide for before a
// revision serves.
type propagationCanned struct {
	name  string
	input PropagationInput
}

// propagationValidationInputs returns pods being created through the usual branches: a CSI
// volume opted in by its StorageClass, by its namespace, or not at all; a volume that is not CSI;
// an unbound claim; mounts with every propagation; a pod without claim volumes.
func propagationValidationInputs() []propagationCanned {
	optIn := map[string]string{annotations.MountPropagationLabel: annotations.MountPropagationHostToContainer}
	mounts := []VolumeMountInfo{
		{Container: "app", ContainerKind: "container", MountPath: "/data"},
		{Container: "init", ContainerKind: "initContainer", MountPath: "/data", Propagation: "None"},
		{Container: "debug", ContainerKind: "ephemeralContainer", MountPath: "/data", Propagation: "HostToContainer"},
		{Container: "agent", ContainerKind: "container", MountPath: "/shared", Propagation: "Bidirectional"},
	}
	volumes := func(scLabels map[string]string) []ClaimVolume {
		return []ClaimVolume{
			{Name: "data", Claim: "data-app-0", PersistentVolume: "pvc-1", Driver: "rbd.csi.ceph.com",
				StorageClass: &ClassInfo{Name: "fast", Labels: scLabels, Parameters: map[string]string{"mounter": "rbd-nbd"}}, Mounts: mounts},
			{Name: "nfs", Claim: "legacy", PersistentVolume: "nfs-1", Mounts: mounts[:1]},
			{Name: "pending", Claim: "new", StorageClass: &ClassInfo{Name: "fast"}, Mounts: mounts[:1]},
		}
	}
	pod := AdmittedPod{Namespace: "shop", GenerateName: "app-", OwnerKind: "ReplicaSet", Labels: map[string]string{"app": "shop"}}
	return []propagationCanned{
		{"a pod not opted in", PropagationInput{Pod: pod, Namespace: Labeled{Name: "shop"}, Volumes: volumes(nil)}},
		{"a pod whose StorageClass opted in", PropagationInput{Pod: pod, Namespace: Labeled{Name: "shop"}, Volumes: volumes(optIn)}},
		{"a pod whose namespace opted in", PropagationInput{Pod: pod, Namespace: Labeled{Name: "shop", Labels: optIn}, Volumes: volumes(nil)}},
		{"a bare pod without claim volumes", PropagationInput{Pod: AdmittedPod{Namespace: "shop", Name: "tools"}, Namespace: Labeled{Name: "shop"}}},
	}
}
