package policy

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
)

// fixtures holds the objects of testdata/drivers.yaml by kind and name.
type fixtures struct {
	pvs     map[string]*corev1.PersistentVolume
	classes map[string]*storagev1.StorageClass
	objects []runtime.Object
}

func loadFixtures(t *testing.T) fixtures {
	t.Helper()
	raw, err := os.ReadFile("testdata/drivers.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f := fixtures{pvs: map[string]*corev1.PersistentVolume{}, classes: map[string]*storagev1.StorageClass{}}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("decoding fixture: %v\n%s", err, doc)
		}
		switch o := obj.(type) {
		case *corev1.PersistentVolume:
			f.pvs[o.Spec.StorageClassName] = o
		case *storagev1.StorageClass:
			f.classes[o.Name] = o
		}
		f.objects = append(f.objects, obj)
	}
	return f
}

func claimFor(pv *corev1.PersistentVolume) *corev1.PersistentVolumeClaim {
	class := pv.Spec.StorageClassName
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   pv.Spec.ClaimRef.Namespace,
			Name:        pv.Spec.ClaimRef.Name,
			Labels:      map[string]string{"app": pv.Spec.ClaimRef.Name},
			Annotations: map[string]string{"volume.kubernetes.io/storage-provisioner": pv.Spec.CSI.Driver},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      pv.Spec.AccessModes,
			Resources:        corev1.VolumeResourceRequirements{Requests: pv.Spec.Capacity},
			StorageClassName: &class,
			VolumeName:       pv.Name,
		},
	}
}

func attachmentFor(pv *corev1.PersistentVolume, node string) *storagev1.VolumeAttachment {
	name := pv.Name
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "csi-" + pv.Name},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: pv.Spec.CSI.Driver, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &name}},
		Status: storagev1.VolumeAttachmentStatus{Attached: true},
	}
}

var testNode = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{"topology.kubernetes.io/zone": "a"}}}

var cephDriver = DriverInfo{Name: "rbd.csi.ceph.com", Healer: HealerCapabilities{Probe: true, Heal: true}}

// TestBuildInputFromRealisticObjects builds inputs from the shapes real drivers produce and checks
// what the policy sees and what the built-in policy decides.
func TestBuildInputFromRealisticObjects(t *testing.T) {
	f := loadFixtures(t)
	ctx := context.Background()
	rev, err := Compile(ctx, DefaultModules(), patient(CompileOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		class    string
		attached bool
		driver   DriverInfo
		check    func(t *testing.T, in Input)
		want     Decision
	}{
		"ceph rbd with rbd-nbd": {
			class: "ceph-rbd-nbd", attached: true, driver: cephDriver,
			check: func(t *testing.T, in Input) {
				if in.Volume.Attributes["mounter"] != "rbd-nbd" || in.Volume.StorageClass.Parameters["mounter"] != "rbd-nbd" {
					t.Errorf("mounter missing: %+v", in.Volume)
				}
				if in.Volume.PVC == nil || in.Volume.PVC.Namespace != "shop" || in.Volume.PVC.Labels["app"] != "orders-db" {
					t.Errorf("claim %+v", in.Volume.PVC)
				}
				if in.Attachment == nil || !in.Attachment.Attached || in.Attachment.Node != "node-1" || in.Node.Labels["topology.kubernetes.io/zone"] != "a" {
					t.Errorf("attachment %+v node %+v", in.Attachment, in.Node)
				}
				if strings.Join(in.Volume.MountOptions, ",") != "discard" || strings.Join(in.Volume.AccessModes, ",") != "ReadWriteOnce" {
					t.Errorf("options %v modes %v", in.Volume.MountOptions, in.Volume.AccessModes)
				}
			},
			want: Decision{Action: ActionProbe, Reason: "ProbeAfterRestart", Priority: 100},
		},
		"cephfs with ceph-fuse, no attachment": {
			class: "cephfs-fuse", driver: DriverInfo{Name: "cephfs.csi.ceph.com", Healer: HealerCapabilities{Probe: true, Heal: true}},
			check: func(t *testing.T, in Input) {
				if in.Attachment != nil || in.Node != nil {
					t.Errorf("attachment %+v node %+v, want none", in.Attachment, in.Node)
				}
				if in.Volume.Attributes["subvolumeName"] == "" || in.Volume.Driver != "cephfs.csi.ceph.com" {
					t.Errorf("volume %+v", in.Volume)
				}
			},
			want: Decision{Action: ActionProbe, Reason: "ProbeAfterRestart", Priority: 100},
		},
		"a driver that implements no healing": {
			class: "gp3", attached: true,
			check: func(t *testing.T, in Input) {
				if in.Driver.Name != "ebs.csi.aws.com" {
					t.Errorf("driver name %q, want it taken from the PV", in.Driver.Name)
				}
			},
			want: Decision{Action: ActionSkip, Reason: "DriverCannotProbe"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pv := f.pvs[tc.class]
			var va *storagev1.VolumeAttachment
			var node *corev1.Node
			if tc.attached {
				va, node = attachmentFor(pv, "node-1"), testNode
			}
			in := BuildInput(pv, claimFor(pv), f.classes[tc.class], va, node, tc.driver, TriggerRestart)
			if in.Volume.PV != pv.Name || in.Volume.Handle != pv.Spec.CSI.VolumeHandle || in.Volume.StorageClass.Name != tc.class {
				t.Errorf("volume %+v", in.Volume)
			}
			tc.check(t, in)
			d, err := rev.Decide(ctx, &in)
			if err != nil || d != tc.want {
				t.Errorf("decision %+v, %v; want %+v", d, err, tc.want)
			}
		})
	}
}

func TestBuildInputWithoutOptionalObjects(t *testing.T) {
	f := loadFixtures(t)
	pv := f.pvs["ceph-rbd"].DeepCopy()
	pv.Status.Phase = corev1.VolumeBound
	in := BuildInput(pv, nil, nil, nil, nil, DriverInfo{}, TriggerSchedule)
	if in.Volume.PVC == nil || in.Volume.PVC.Name != "catalog-db" {
		t.Errorf("a bound PV whose claim is not at hand: claim %+v, want the PV's claimRef", in.Volume.PVC)
	}
	if in.Volume.StorageClass == nil || in.Volume.StorageClass.Name != "ceph-rbd" || len(in.Volume.StorageClass.Parameters) != 0 {
		t.Errorf("a missing StorageClass: %+v, want the name without parameters", in.Volume.StorageClass)
	}
	pv.Status.Phase = corev1.VolumeReleased
	if in := BuildInput(pv, nil, nil, nil, nil, DriverInfo{}, TriggerSchedule); in.Volume.PVC != nil {
		t.Errorf("a released PV has claim %+v", in.Volume.PVC)
	}
}

// TestInputFromClusterAndExplain builds the input the way `healerctl policy explain` does, from a
// cluster, and explains the built-in policy's decision.
func TestInputFromClusterAndExplain(t *testing.T) {
	f := loadFixtures(t)
	pv := f.pvs["ceph-rbd-nbd"]
	pvc, va := claimFor(pv), attachmentFor(pv, "node-1")
	other := attachmentFor(f.pvs["ceph-rbd"], "node-2")
	objects := append([]runtime.Object{pvc, va, other, testNode}, f.objects...)
	client := fake.NewClientset(objects...)
	ctx := context.Background()

	in, err := InputFromCluster(ctx, client, pv.Name, ClusterInputOptions{
		Trigger: TriggerRestart, Driver: cephDriver, Probe: brokenProbe(),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := BuildInput(pv, pvc, f.classes["ceph-rbd-nbd"], va, testNode, cephDriver, TriggerRestart)
	want.Probe = brokenProbe()
	want.Remedies.Heal = cephDriver.Healer.Heal // the driver heals: so may the remedy
	if in.astValue().Compare(want.astValue()) != 0 {
		t.Fatalf("input from the cluster\n%s\nwant\n%s", mustJSON(t, in), mustJSON(t, want))
	}

	rev, err := Compile(ctx, DefaultModules(), patient(CompileOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	x, err := rev.Explain(ctx, &in)
	if err != nil {
		t.Fatal(err)
	}
	if x.Err != nil || x.Decision != (Decision{Action: ActionHeal, Reason: "HealAfterRestart", Priority: 100}) {
		t.Fatalf("explained decision %+v, %v", x.Decision, x.Err)
	}
	fired := map[string]bool{}
	for _, r := range x.Fired {
		fired[r.Rule] = true
		if !strings.HasPrefix(r.Location, "builtin:default/") {
			t.Errorf("fired rule %s at %q", r.Rule, r.Location)
		}
	}
	for _, r := range []string{"data.volumehealer.decision", "data.volumehealer.builtin.second_pass", "data.volumehealer.builtin.probed"} {
		if !fired[r] {
			t.Errorf("%s did not fire; fired: %v", r, x.Fired)
		}
	}
	if fired["data.volumehealer.builtin.first_pass"] {
		t.Error("first_pass fired in the second evaluation")
	}
	var out bytes.Buffer
	if err := x.WriteText(&out, false); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`decision: {"action":"heal","reason":"HealAfterRestart","priority":100}`, "rules that fired:",
		"second_pass := skip(\"Kept\") if {", "else := skip(\"Healthy\") if {", "rules tried that did not fire:", "node node-1"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("explanation lacks %q:\n%s", s, out.String())
		}
	}
	if strings.Contains(out.String(), "\ntrace:") {
		t.Error("the full trace was printed without asking")
	}

	if _, err := InputFromCluster(ctx, client, "pvc-missing", ClusterInputOptions{Trigger: TriggerRestart}); err == nil {
		t.Error("a missing PV was not reported")
	}
}

func TestAssumedDriverAndProbe(t *testing.T) {
	d, err := AssumedDriver([]string{"probe", "listVolumes"}, []string{"SERVICE:NODE_SERVICE"}, map[string]string{"k": "v"})
	if err != nil || !d.Healer.Probe || d.Healer.Heal || !d.Healer.ListVolumes || d.Healer.Attributes["k"] != "v" {
		t.Errorf("driver %+v, %v", d, err)
	}
	d, err = AssumedDriver([]string{"probe", "heal", "pluginRestart"}, nil, nil)
	if err != nil || d.Healer.VolumeKeeping != (VolumeKeeping{PluginRestart: true}) {
		t.Errorf("driver with volume keeping %+v, %v; want pluginRestart alone", d.Healer.VolumeKeeping, err)
	}
	if _, err := AssumedDriver([]string{"repair"}, nil, nil); err == nil {
		t.Error("an unknown capability was accepted")
	}
	p, err := AssumedProbe("data-loss", "Corrupt", false)
	if err != nil || p.Healthy || p.Healable || p.Health[0].Status != HealthDataLoss {
		t.Errorf("probe %+v, %v", p, err)
	}
	if p, err := AssumedProbe("healthy", "", true); err != nil || !p.Healthy {
		t.Errorf("probe %+v, %v", p, err)
	}
	if _, err := AssumedProbe("sick", "", true); err == nil {
		t.Error("an unknown status was accepted")
	}
}

func TestExplainShowsOnlyTheBranchThatFired(t *testing.T) {
	ctx := context.Background()
	rev, err := Compile(ctx, DefaultModules(), patient(CompileOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	in := sampleInput()
	in.Probe = brokenProbe()
	in.Probe.Health = append(in.Probe.Health, Health{Status: HealthDataLoss, Reason: "Corrupt"})
	x, err := rev.Explain(ctx, &in)
	if err != nil || x.Decision.Reason != "DataLoss" {
		t.Fatalf("explained %+v, %v", x.Decision, err)
	}
	for _, r := range x.Fired {
		if r.Rule != "data.volumehealer.builtin.second_pass" {
			continue
		}
		want := "else := skip(\"DataLoss\") if {\n\t# A volume that may have lost data needs a human: healing could make it worse.\n\tinput.probe.health[_].status == \"DATA_LOSS\"\n}"
		if r.Source != want {
			t.Errorf("fired branch shown as\n%s\nwant\n%s", r.Source, want)
		}
		return
	}
	t.Errorf("second_pass did not fire: %v", x.Fired)
}
