package policy

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// libraryExamples are the folders of examples/, the library of site policies users start from.
var libraryExamples = []string{"ceph-rbd-nbd", "cephfs-fuse", "generic-fuse", "probe-only", "stock-recycle"}

// loadExample loads an example's policy.rego the way the controller loads a policy ConfigMap
// holding it: through ModulesFromConfigMaps and the engine, which compiles and validates the set
// before it serves.
func loadExample(t *testing.T, name string) *Engine {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("examples", name, "policy.rego"))
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "volume-healer", Name: name, Labels: map[string]string{"volume-healer.io/policy": "rego"}},
		Data:       map[string]string{"policy.rego": string(text)},
	}
	ctx := context.Background()
	engine, err := NewEngine(ctx, Options{Compile: patient(CompileOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Load(ctx, ModulesFromConfigMaps([]*corev1.ConfigMap{cm})); err != nil {
		t.Fatalf("the controller rejects examples/%s as a policy ConfigMap: %v", name, err)
	}
	return engine
}

// TestLibraryExamplesRegoTests runs each example's Rego tests through the engine's loader, and
// checks that every folder of examples/ is one this test knows and that each explains itself.
func TestLibraryExamplesRegoTests(t *testing.T) {
	dirs, err := filepath.Glob("examples/*/policy.rego")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, d := range dirs {
		found = append(found, filepath.Base(filepath.Dir(d)))
	}
	if !slices.Equal(found, libraryExamples) {
		t.Fatalf("examples/ holds %v, want %v: add a new example here and to its scenarios below", found, libraryExamples)
	}
	readme, err := os.ReadFile("examples/README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range libraryExamples {
		t.Run(name, func(t *testing.T) {
			if !strings.Contains(string(readme), "("+name+"/policy.rego)") {
				t.Errorf("examples/README.md does not link %s/policy.rego", name)
			}
			text, err := os.ReadFile(filepath.Join("examples", name, "policy.rego"))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(text), "# Use when:") {
				t.Errorf("examples/%s/policy.rego has no \"Use when:\" header", name)
			}
			mods, err := LoadFiles(filepath.Join("examples", name))
			if err != nil {
				t.Fatal(err)
			}
			results, err := RunTests(context.Background(), mods, TestOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range results {
				if r.Outcome != OutcomePass {
					t.Errorf("%s", r)
				}
			}
			if err := CheckTests(results); err != nil || len(results) < 4 {
				t.Errorf("%d Rego tests: %v", len(results), err)
			}
		})
	}
}

// exampleScenario is a volume of testdata/drivers.yaml as the controller sees it, and what a user
// of an example expects the controller to do with it.
type exampleScenario struct {
	name     string
	class    string     // the StorageClass of the fixture PV
	csi      string     // when set, the PV's CSI driver instead of the fixture's
	driver   DriverInfo // what the node's sidecar reported
	remedies Remedies
	probe    *ProbeResult
	// want is the decision's action, and for a skip its reason ("" for any).
	want       Action
	wantReason string
	// restart, when set, is the restart decision wanted for a ReplicaSet pod of the volume in a
	// namespace that opted in to evictions, after the remedy the decision names.
	restart RestartAction
}

var (
	healerDriver = func(name string) DriverInfo {
		return DriverInfo{Name: name, Healer: HealerCapabilities{Probe: true, Heal: true}, Tier: TierHealer, ProbeSource: "driver"}
	}
	stockDriver = func(name string) DriverInfo {
		return DriverInfo{Name: name, Healer: HealerCapabilities{Probe: true}, Tier: TierNone, ProbeSource: "sidecar"}
	}
	allRemedies = Remedies{Heal: true, RestartContainers: false, Evict: true}
	mountGone   = &ProbeResult{Health: []Health{{Status: "INACCESSIBLE", Reason: "MountGone", Message: "transport endpoint is not connected"}}, Healable: true}
	unhealable  = &ProbeResult{Health: []Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}}
	healthy     = &ProbeResult{Healthy: true}
)

// TestLibraryExamplesDecide loads each example as the controller does and asks it about the
// realistic volumes of testdata/drivers.yaml (Ceph RBD with rbd-nbd and krbd, CephFS with
// ceph-fuse, an EBS volume), checking the decisions a user of that example expects.
func TestLibraryExamplesDecide(t *testing.T) {
	scenarios := map[string][]exampleScenario{
		"ceph-rbd-nbd": {
			{name: "rbd-nbd probed", class: "ceph-rbd-nbd", driver: healerDriver("rbd.csi.ceph.com"), remedies: allRemedies, want: ActionProbe},
			{name: "rbd-nbd dead mount healed", class: "ceph-rbd-nbd", driver: healerDriver("rbd.csi.ceph.com"), remedies: allRemedies, probe: mountGone, want: ActionHeal, restart: RestartEvict},
			{name: "krbd skipped", class: "ceph-rbd", driver: healerDriver("rbd.csi.ceph.com"), remedies: allRemedies, want: ActionSkip, wantReason: "KernelMounter"},
			{name: "krbd skipped after a probe", class: "ceph-rbd", driver: healerDriver("rbd.csi.ceph.com"), remedies: allRemedies, probe: mountGone, want: ActionSkip, wantReason: "KernelMounter"},
			{name: "EBS follows the built-in policy", class: "gp3", driver: DriverInfo{Name: "ebs.csi.aws.com"}, remedies: allRemedies, want: ActionSkip, wantReason: "DriverCannotProbe"},
		},
		"cephfs-fuse": {
			{name: "ceph-fuse probed", class: "cephfs-fuse", driver: healerDriver("cephfs.csi.ceph.com"), remedies: allRemedies, want: ActionProbe},
			{name: "ceph-fuse healed", class: "cephfs-fuse", driver: healerDriver("cephfs.csi.ceph.com"), remedies: allRemedies, probe: mountGone, want: ActionHeal, restart: RestartEvict},
			{name: "healthy ceph-fuse left alone", class: "cephfs-fuse", driver: healerDriver("cephfs.csi.ceph.com"), remedies: allRemedies, probe: healthy, want: ActionSkip, wantReason: "Healthy"},
			{name: "rbd-nbd follows the built-in policy", class: "ceph-rbd-nbd", driver: healerDriver("rbd.csi.ceph.com"), remedies: allRemedies, probe: mountGone, want: ActionHeal},
		},
		"generic-fuse": {
			{name: "listed FUSE driver probed", class: "cephfs-fuse", csi: "fuse.csi.example.com", driver: healerDriver("fuse.csi.example.com"), remedies: allRemedies, want: ActionProbe},
			{name: "listed FUSE driver healed", class: "cephfs-fuse", csi: "fuse.csi.example.com", driver: healerDriver("fuse.csi.example.com"), remedies: allRemedies, probe: mountGone, want: ActionHeal, restart: RestartEvict},
			{name: "listed FUSE driver recycles what it cannot heal", class: "cephfs-fuse", csi: "fuse.csi.example.com", driver: healerDriver("fuse.csi.example.com"), remedies: allRemedies, probe: unhealable, want: ActionRecycle, restart: RestartEvict},
			{name: "Ceph is not a listed FUSE driver", class: "ceph-rbd-nbd", driver: healerDriver("rbd.csi.ceph.com"), remedies: allRemedies, probe: mountGone, want: ActionSkip, wantReason: "NotAFuseDriver", restart: RestartLeave},
			{name: "CephFS is not a listed FUSE driver", class: "cephfs-fuse", driver: healerDriver("cephfs.csi.ceph.com"), remedies: allRemedies, want: ActionSkip, wantReason: "NotAFuseDriver"},
		},
		"stock-recycle": {
			{name: "stock rbd-nbd probed by the sidecar", class: "ceph-rbd-nbd", driver: stockDriver("rbd.csi.ceph.com"), remedies: allRemedies, want: ActionProbe},
			{name: "stock rbd-nbd recycled where evictions are on", class: "ceph-rbd-nbd", driver: stockDriver("rbd.csi.ceph.com"), remedies: allRemedies, probe: unhealable, want: ActionRecycle, restart: RestartEvict},
			{name: "stock rbd-nbd not recycled without evictions", class: "ceph-rbd-nbd", driver: stockDriver("rbd.csi.ceph.com"), remedies: Remedies{}, probe: unhealable, want: ActionSkip, wantReason: "RecycleNeedsEvictions"},
			{name: "stock ceph-fuse recycled", class: "cephfs-fuse", driver: stockDriver("cephfs.csi.ceph.com"), remedies: allRemedies, probe: unhealable, want: ActionRecycle, restart: RestartEvict},
			{name: "a healing RBD driver heals", class: "ceph-rbd-nbd", driver: healerDriver("rbd.csi.ceph.com"), remedies: allRemedies, probe: mountGone, want: ActionHeal},
			{name: "EBS stock volume left to the built-in policy", class: "gp3", driver: stockDriver("ebs.csi.aws.com"), remedies: Remedies{}, probe: unhealable, want: ActionSkip, wantReason: "NotHealable"},
		},
		"probe-only": {
			{name: "rbd-nbd probed", class: "ceph-rbd-nbd", driver: healerDriver("rbd.csi.ceph.com"), remedies: allRemedies, want: ActionProbe},
			{name: "dead rbd-nbd reported, not healed", class: "ceph-rbd-nbd", driver: healerDriver("rbd.csi.ceph.com"), remedies: allRemedies, probe: mountGone, want: ActionSkip, wantReason: "ProbeOnly", restart: RestartLeave},
			{name: "stock volume reported, not recycled", class: "cephfs-fuse", driver: stockDriver("cephfs.csi.ceph.com"), remedies: allRemedies, probe: unhealable, want: ActionSkip, wantReason: "ProbeOnly", restart: RestartLeave},
		},
	}
	f := loadFixtures(t)
	ctx := context.Background()
	for _, name := range libraryExamples {
		t.Run(name, func(t *testing.T) {
			if len(scenarios[name]) == 0 {
				t.Fatalf("no scenario for examples/%s", name)
			}
			engine := loadExample(t, name)
			for _, sc := range scenarios[name] {
				t.Run(sc.name, func(t *testing.T) {
					pv := f.pvs[sc.class]
					if pv == nil {
						t.Fatalf("testdata/drivers.yaml has no PV of StorageClass %s", sc.class)
					}
					if sc.csi != "" {
						pv = pv.DeepCopy()
						pv.Spec.CSI.Driver = sc.csi
					}
					var va = attachmentFor(pv, testNode.Name)
					if sc.class == "cephfs-fuse" {
						va = nil // CephFS has no attach step
					}
					in := BuildInput(pv, claimFor(pv), f.classes[sc.class], va, testNode, sc.driver, TriggerRestart)
					in.Remedies = sc.remedies
					in.Probe = sc.probe
					got, err := engine.Decide(ctx, &in)
					if err != nil {
						t.Fatal(err)
					}
					if got.Action != sc.want || (sc.wantReason != "" && got.Reason != sc.wantReason) {
						t.Errorf("decision %s/%s, want %s/%s", got.Action, got.Reason, sc.want, sc.wantReason)
					}
					if sc.restart == "" {
						return
					}
					remedy := RemedyHeal
					if got.Action == ActionRecycle {
						remedy = RemedyRecycle
					}
					ns := Labeled{Name: pv.Spec.ClaimRef.Namespace, Labels: map[string]string{"volume-healer.io/evict-pods": "true"}}
					pod := &corev1.Pod{
						ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "app-7d9f-abcde",
							OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "app-7d9f", Controller: ptrTo(true)}}},
						Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyAlways},
					}
					rin := PodScope{Namespace: ns, StorageClass: &Labeled{Name: sc.class}}.Input(in, pod, time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
					rin.Remedy = remedy
					rd, err := engine.DecideRestart(ctx, &rin)
					if err != nil {
						t.Fatal(err)
					}
					if rd.Action != sc.restart {
						t.Errorf("restart decision for a ReplicaSet pod after %s: %s/%s, want %s", remedy, rd.Action, rd.Reason, sc.restart)
					}
				})
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }
