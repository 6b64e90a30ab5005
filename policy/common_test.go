package policy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// policyText builds a module of package volumehealer from lines.
func policyText(lines ...string) string {
	return "package volumehealer\n\n" + strings.Join(lines, "\n") + "\n"
}

// mustCompile compiles one module named file or fails the test.
func mustCompile(t testing.TB, file, text string, opts CompileOptions) *Revision {
	t.Helper()
	opts = patient(opts)
	rev, err := Compile(context.Background(), []Module{{File: file, Text: text}}, opts)
	if err != nil {
		t.Fatalf("compiling %s: %v", file, err)
	}
	return rev
}

// sampleInput is a fully populated first-evaluation input of an rbd-nbd volume.
func sampleInput() Input {
	lastProbe := time.Date(2025, 1, 1, 11, 30, 0, 0, time.UTC)
	lastHeal := time.Date(2024, 12, 24, 8, 0, 0, 0, time.UTC)
	return Input{
		Trigger: TriggerRestart,
		Volume: Volume{
			PV:           "pvc-3f2a9c1e-5d6b-4c1a-9e7f-0a1b2c3d4e5f",
			Handle:       "0001-0009-rook-ceph-0000000000000002-7c1e2d3f-4a5b-11ef-9c1d-0a580a810212",
			Driver:       "rbd.csi.ceph.com",
			Attributes:   map[string]string{"mounter": "rbd-nbd", "pool": "replicapool", "clusterID": "rook-ceph"},
			MountOptions: []string{"discard"},
			AccessModes:  []string{"ReadWriteOnce"},
			StorageClass: &StorageClass{Name: "ceph-rbd-nbd", Parameters: map[string]string{"mounter": "rbd-nbd", "pool": "replicapool"}},
			PVC: &Claim{Namespace: "shop", Name: "orders-db",
				Labels:      map[string]string{"app": "orders"},
				Annotations: map[string]string{"owner": "team-a"}},
		},
		Attachment: &Attachment{Node: "node-1", Attached: true},
		Node:       &Node{Name: "node-1", Labels: map[string]string{"topology.kubernetes.io/zone": "a"}},
		Driver: DriverInfo{
			Name:                 "rbd.csi.ceph.com",
			IdentityCapabilities: []string{"SERVICE:NODE_SERVICE"},
			Healer:               HealerCapabilities{Probe: true, Heal: true, Attributes: map[string]string{"healMounters": "rbd-nbd"}},
			Tier:                 TierHealer,
			ProbeSource:          "driver",
		},
		History: History{
			LastProbe:           &ProbeRecord{Time: lastProbe, Healthy: true, Health: []Health{}},
			ConsecutiveFailures: 0,
			LastHeal:            &lastHeal,
		},
	}
}

// brokenProbe is a probe result of a volume whose mount is gone.
func brokenProbe() *ProbeResult {
	return &ProbeResult{Healable: true, Health: []Health{{Status: HealthInaccessible, Reason: "MountGone", Message: "/dev/nbd0 is gone"}}}
}

// randomInput draws an input from small domains, so that random inputs often agree on the
// fields a policy reads while differing elsewhere.
func randomInput(r *rand.Rand) Input {
	pick := func(options ...string) string { return options[r.IntN(len(options))] }
	maybe := func() bool { return r.IntN(2) == 0 }
	strs := func(options ...string) map[string]string {
		m := map[string]string{}
		for i := r.IntN(3); i > 0; i-- {
			m[pick(options...)] = pick("a", "b", "true", "rbd-nbd", "fuse")
		}
		return m
	}
	in := Input{
		Trigger: Trigger(pick("restart", "schedule", "manual")),
		Volume: Volume{
			PV:          fmt.Sprintf("pvc-%d", r.IntN(1000)),
			Handle:      fmt.Sprintf("handle-%d", r.IntN(1000)),
			Driver:      pick("rbd.csi.ceph.com", "cephfs.csi.ceph.com", "ebs.csi.aws.com"),
			Attributes:  strs("mounter", "pool", "fsName"),
			AccessModes: []string{pick("ReadWriteOnce", "ReadWriteMany", "ReadOnlyMany")},
		},
		Driver: DriverInfo{
			Name: pick("rbd.csi.ceph.com", "cephfs.csi.ceph.com"),
			Healer: HealerCapabilities{Probe: maybe(), Heal: maybe(), ListVolumes: maybe(), Attributes: strs("healMounters"),
				VolumeKeeping: VolumeKeeping{PluginRestart: maybe(), MounterRestart: maybe()}},
			Tier:        pick(TierHealer, TierProbeOnly, TierNone),
			ProbeSource: pick("driver", "sidecar"),
		},
		History:  History{ConsecutiveFailures: r.IntN(4)},
		Remedies: Remedies{Heal: maybe(), RestartContainers: maybe(), Evict: maybe()},
	}
	if maybe() {
		in.Volume.MountOptions = []string{pick("discard", "noatime")}
	}
	if maybe() {
		in.Driver.IdentityCapabilities = []string{pick("SERVICE:NODE_SERVICE", "SERVICE:CONTROLLER_SERVICE")}
	}
	if maybe() {
		in.Volume.StorageClass = &StorageClass{Name: pick("ceph-rbd-nbd", "ceph-rbd", "cephfs-fuse"), Parameters: strs("mounter", "pool")}
	}
	if maybe() {
		in.Volume.PVC = &Claim{Namespace: pick("shop", "scratch"), Name: pick("db", "cache"),
			Labels: strs("volume-healer.io/skip", "app"), Annotations: strs("owner")}
	}
	if maybe() {
		in.Attachment = &Attachment{Node: pick("node-1", "node-2"), Attached: r.IntN(4) > 0, Detaching: r.IntN(4) == 0}
		in.Node = &Node{Name: in.Attachment.Node, Labels: strs("zone")}
	}
	health := func() []Health {
		var hs []Health
		for i := r.IntN(3); i > 0; i-- {
			hs = append(hs, Health{
				Status:  HealthStatus(pick(string(HealthDegraded), string(HealthInaccessible), string(HealthDataLoss))),
				Reason:  pick("MountGone", "ReadOnly"),
				Message: fmt.Sprintf("message %d", r.IntN(100)),
			})
		}
		return hs
	}
	if maybe() {
		t := time.Date(2025, 1, 1, 10+r.IntN(3), 0, 0, 0, time.UTC)
		in.History.LastProbe = &ProbeRecord{Time: t, Healthy: maybe(), Health: health()}
	}
	if maybe() {
		t := time.Date(2024, 12, 1+r.IntN(2), 0, 0, 0, 0, time.UTC)
		in.History.LastHeal = &t
	}
	if maybe() {
		hs := health()
		in.Probe = &ProbeResult{Healthy: len(hs) == 0, Health: hs, Healable: maybe(), RecheckAfterSeconds: int64(r.IntN(2) * 30), Kept: maybe()}
	}
	return in
}

// metricValue returns the value of the counter or gauge name{labels} in reg, or -1 when absent.
func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if matchLabels(m, labels) {
				switch {
				case m.Counter != nil:
					return m.Counter.GetValue()
				case m.Gauge != nil:
					return m.Gauge.GetValue()
				case m.Histogram != nil:
					return float64(m.Histogram.GetSampleCount())
				}
			}
		}
	}
	return -1
}

func matchLabels(m *dto.Metric, labels map[string]string) bool {
	if len(m.GetLabel()) != len(labels) {
		return false
	}
	for _, l := range m.GetLabel() {
		if labels[l.GetName()] != l.GetValue() {
			return false
		}
	}
	return true
}

// testEvalTimeout bounds evaluations in tests that are not about timeouts. The production default
// (100ms) is far above what an evaluation takes, but a test run under the race detector on a
// loaded 2-core machine has seen single evaluations take longer, and such a test would then fail
// for a reason it does not test.
const testEvalTimeout = 10 * time.Second

// patient gives opts the test evaluation timeout unless it sets one on purpose.
func patient(opts CompileOptions) CompileOptions {
	if opts.EvalTimeout == 0 {
		opts.EvalTimeout = testEvalTimeout
	}
	return opts
}
