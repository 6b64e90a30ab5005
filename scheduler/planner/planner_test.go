package planner

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-healer/volume-healer/policy"
)

func pv(name, sc, driver string, phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			StorageClassName:       sc,
			ClaimRef:               &corev1.ObjectReference{Namespace: "shop", Name: "claim-" + name},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "h-" + name}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: phase},
	}
}

func va(pvName, driver, node string, attached bool) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "va-" + pvName + "-" + node},
		Spec:       storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: node, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
		Status:     storagev1.VolumeAttachmentStatus{Attached: attached},
	}
}

func newTestPlanner(t *testing.T, objs ...any) *Planner {
	t.Helper()
	c := NewLocalCaches()
	for _, o := range objs {
		if err := c.Add(o.(runtime.Object)); err != nil {
			t.Fatal(err)
		}
	}
	return New(c)
}

func TestPlannerGuards(t *testing.T) {
	now := metav1.Now()
	deleting := func(p *corev1.PersistentVolume) *corev1.PersistentVolume { p.DeletionTimestamp = &now; return p }
	detaching := func(v *storagev1.VolumeAttachment) *storagev1.VolumeAttachment { v.DeletionTimestamp = &now; return v }
	detachErr := func(v *storagev1.VolumeAttachment) *storagev1.VolumeAttachment {
		v.Status.DetachError = &storagev1.VolumeError{Message: "busy"}
		return v
	}
	tests := map[string]struct {
		pv     *corev1.PersistentVolume
		va     *storagev1.VolumeAttachment
		reason string // "" = selected
	}{
		"bound and attached":             {pv: pv("a", "gold", "d", corev1.VolumeBound), va: va("a", "d", "n1", true)},
		"VolumeAttachment being deleted": {pv: pv("a", "gold", "d", corev1.VolumeBound), va: detaching(va("a", "d", "n1", true)), reason: "VolumeAttachment is being deleted (detaching)"},
		"VolumeAttachment detach error":  {pv: pv("a", "gold", "d", corev1.VolumeBound), va: detachErr(va("a", "d", "n1", true)), reason: "VolumeAttachment has a detach error (detaching)"},
		"VolumeAttachment not attached":  {pv: pv("a", "gold", "d", corev1.VolumeBound), va: va("a", "d", "n1", false), reason: "VolumeAttachment is not attached"},
		"PV released":                    {pv: pv("a", "gold", "d", corev1.VolumeReleased), va: va("a", "d", "n1", true), reason: "PV is Released, not Bound"},
		"PV being deleted":               {pv: deleting(pv("a", "gold", "d", corev1.VolumeBound)), va: va("a", "d", "n1", true), reason: "PV is being deleted"},
		"PV missing from the cache":      {va: va("a", "d", "n1", true), reason: "PV not found"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			objs := []any{tc.va}
			if tc.pv != nil {
				objs = append(objs, tc.pv)
			}
			p := newTestPlanner(t, objs...)
			vols, skipped := p.NodeVolumes("d", "n1")
			if tc.reason == "" {
				if len(vols) != 1 || len(skipped) != 0 || vols[0].PVName != "a" || vols[0].NodeName != "n1" {
					t.Fatalf("volumes %v, skipped %v; want volume a on n1", vols, skipped)
				}
				return
			}
			if len(vols) != 0 || len(skipped) != 1 || skipped[0].Reason != tc.reason {
				t.Fatalf("volumes %v, skipped %+v; want skipped with %q", vols, skipped, tc.reason)
			}
		})
	}
}

func TestPlannerSelection(t *testing.T) {
	noAttach := false
	p := newTestPlanner(t,
		pv("r1", "rbd-nbd", "rbd", corev1.VolumeBound), pv("r2", "rbd-nbd", "rbd", corev1.VolumeBound),
		pv("r3", "krbd", "rbd", corev1.VolumeBound), pv("f1", "cephfs", "cephfs", corev1.VolumeBound),
		va("r1", "rbd", "n1", true), va("r2", "rbd", "n2", true), va("r3", "rbd", "n1", true),
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "claim-r1"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "r1"}},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "rbd-nbd"}, Parameters: map[string]string{"mounter": "rbd-nbd"}},
		&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "cephfs"}, Spec: storagev1.CSIDriverSpec{AttachRequired: &noAttach}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "a"}}},
	)

	vols, _ := p.NodeVolumes("rbd", "n1")
	if len(vols) != 2 || vols[0].PVName != "r1" || vols[1].PVName != "r3" {
		t.Fatalf("rbd on n1 = %v, want r1 and r3", names(vols))
	}
	if o := vols[0].Objects(); o.PVC == nil || o.PVC.Name != "claim-r1" || o.StorageClass == nil || o.Node == nil || o.Node.Labels["zone"] != "a" ||
		o.Attachment == nil || o.Attachment.Spec.NodeName != "n1" || o.PV.Spec.CSI == nil || o.PV.Spec.CSI.Driver != "rbd" {
		t.Errorf("r1's objects not joined: %+v", vols[0])
	}

	vols, _ = p.ClassVolumes("rbd-nbd")
	if len(vols) != 2 || vols[0].NodeName != "n1" || vols[1].NodeName != "n2" {
		t.Fatalf("class rbd-nbd = %v, want r1 on n1 and r2 on n2", names(vols))
	}
	if vols, _ := p.ClassVolumes("cephfs"); len(vols) != 0 {
		t.Fatalf("class cephfs from attachments = %v, want none (no attach step)", names(vols))
	}
	if d := p.ClassDrivers("cephfs"); len(d) != 1 || d[0] != "cephfs" {
		t.Fatalf("drivers without attach in cephfs = %v", d)
	}
	if p.AttachRequired("cephfs") || !p.AttachRequired("rbd") || !p.AttachRequired("unknown") {
		t.Error("AttachRequired does not follow the CSIDriver objects")
	}

	vols, skipped := p.StagedVolumes("cephfs", "n3", []string{"f1", "r1", "gone"})
	if len(vols) != 1 || vols[0].PVName != "f1" || vols[0].NodeName != "n3" || vols[0].AttachmentName != "" || vols[0].Objects().Attachment != nil {
		t.Fatalf("staged cephfs on n3 = %v, want f1 without attachment", names(vols))
	}
	if len(skipped) != 2 {
		t.Errorf("skipped = %+v, want r1 (other driver) and gone (no PV)", skipped)
	}
}

func names(vols []Volume) []string {
	var out []string
	for _, v := range vols {
		out = append(out, v.PVName+"@"+v.NodeName)
	}
	return out
}

func TestPlannerRecheckSeesLaterDetach(t *testing.T) {
	attachment := va("a", "d", "n1", true)
	p := newTestPlanner(t, pv("a", "gold", "d", corev1.VolumeBound), attachment)
	vols, _ := p.NodeVolumes("d", "n1")
	if len(vols) != 1 {
		t.Fatalf("planned %v", names(vols))
	}
	if _, reason := p.Recheck(vols[0]); reason != "" {
		t.Fatalf("recheck of an unchanged volume: %q", reason)
	}
	detaching := attachment.DeepCopy()
	now := metav1.Now()
	detaching.DeletionTimestamp = &now
	if err := p.c.Add(detaching); err != nil {
		t.Fatal(err)
	}
	if _, reason := p.Recheck(vols[0]); reason != "VolumeAttachment is being deleted (detaching)" {
		t.Errorf("recheck after the detach began: %q", reason)
	}
	if err := p.c.VolumeAttachments.Delete(detaching); err != nil {
		t.Fatal(err)
	}
	if _, reason := p.Recheck(vols[0]); reason != "VolumeAttachment is gone (detached)" {
		t.Errorf("recheck after the detach: %q", reason)
	}
}

func TestPlannerClaimMustBeTheBoundOne(t *testing.T) {
	bound := pv("a", "gold", "d", corev1.VolumeBound)
	bound.Spec.ClaimRef.UID = "uid-1"
	claim := func(uid types.UID, volume string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "claim-a", UID: uid,
			Annotations: map[string]string{"team": "db"}}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: volume}}
	}
	tests := map[string]struct {
		claim *corev1.PersistentVolumeClaim
		want  bool
	}{
		"the bound claim":                 {claim: claim("uid-1", "a"), want: true},
		"a new claim of the same name":    {claim: claim("uid-2", "a")},
		"a claim bound to another volume": {claim: claim("uid-1", "b")},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := newTestPlanner(t, bound, va("a", "d", "n1", true), tc.claim)
			vols, _ := p.NodeVolumes("d", "n1")
			if len(vols) != 1 {
				t.Fatalf("volumes %v, want a", names(vols))
			}
			got := vols[0].Claim()
			if (got != nil) != tc.want {
				t.Fatalf("claim = %v, want found %v", got, tc.want)
			}
			if got == nil {
				return
			}
			if got.UID != "uid-1" || got.Annotations["team"] != "db" || vols[0].ClaimName().String() != "shop/claim-a" {
				t.Errorf("claim = %+v", got.ObjectMeta)
			}
			if v, ok := vols[0].ClaimAnnotation("team"); !ok || v != "db" {
				t.Errorf("ClaimAnnotation(team) = %q, %v", v, ok)
			}
		})
	}
}

func TestPlannerPVVolumesFindsEveryAttachment(t *testing.T) {
	p := newTestPlanner(t, pv("a", "gold", "d", corev1.VolumeBound), pv("b", "gold", "d", corev1.VolumeBound),
		va("a", "d", "n1", true), va("a", "d", "n2", true), va("b", "d", "n1", true))
	vols, _ := p.PVVolumes("a")
	if got := names(vols); len(got) != 2 || got[0] != "a@n1" || got[1] != "a@n2" {
		t.Fatalf("PVVolumes(a) = %v, want a@n1 and a@n2", got)
	}
	if vols, _ := p.PVVolumes("missing"); len(vols) != 0 {
		t.Errorf("PVVolumes(missing) = %v", names(vols))
	}
}

func TestPolicyInputMatchesBuildInput(t *testing.T) {
	withAttrs := pv("a", "gold", "d", corev1.VolumeBound)
	withAttrs.Spec.CSI.VolumeAttributes = map[string]string{"pool": "rbd", "imageName": "csi-vol-8d7c3a6e-9f41-4b62-8a1d-2c5e8f0b7d34"}
	withAttrs.Spec.MountOptions = []string{"discard"}
	withAttrs.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadOnlyMany}
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "claim-a",
		Labels: map[string]string{"app": "db"}, Annotations: map[string]string{"team": "payments"}}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "a"}}
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold"}, Parameters: map[string]string{"mounter": "rbd-nbd"}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "a"}}}
	noAttach := false
	tests := map[string]struct {
		objs   []any
		staged bool
	}{
		"everything cached":            {objs: []any{withAttrs, va("a", "d", "n1", true), claim, class, node}},
		"claim not cached":             {objs: []any{withAttrs, va("a", "d", "n1", true), class}},
		"no node, no class":            {objs: []any{pv("a", "gold", "d", corev1.VolumeBound), va("a", "d", "n1", true)}},
		"no attach step, node cached":  {objs: []any{withAttrs, claim, node, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "d"}, Spec: storagev1.CSIDriverSpec{AttachRequired: &noAttach}}}, staged: true},
		"no attach step, nothing else": {objs: []any{pv("a", "", "d", corev1.VolumeBound)}, staged: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := newTestPlanner(t, tc.objs...)
			var vols []Volume
			if tc.staged {
				vols, _ = p.StagedVolumes("d", "n1", []string{"a"})
			} else {
				vols, _ = p.NodeVolumes("d", "n1")
			}
			if len(vols) != 1 {
				t.Fatalf("volumes %v, want a", names(vols))
			}
			driver := policy.DriverInfo{Healer: policy.HealerCapabilities{Probe: true}}
			o := vols[0].Objects()
			want := policy.BuildInput(o.PV, o.PVC, o.StorageClass, o.Attachment, o.Node, driver, policy.TriggerSchedule)
			got := vols[0].PolicyInput(driver, policy.TriggerSchedule)
			if v := got.RegoValue(); v.Compare(want.RegoValue()) != 0 {
				t.Errorf("PolicyInput as the policy sees it:\n got %v\nwant %v", v, want.RegoValue())
			}
			got.Terms = policy.InputTerms{}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("PolicyInput:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

// TestPolicyInputTermsOverVariedVolumes checks, over volumes with varied attributes, labels,
// annotations, access modes, classes and nodes, that the input the planner builds with shared
// Rego parts is, as the policy sees it, the input policy.BuildInput builds from the objects
// (which the policy package checks against the documented map form): no field is lost by
// building it from the records.
func TestPolicyInputTermsOverVariedVolumes(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	pick := func(options ...string) string { return options[r.IntN(len(options))] }
	strs := func(long bool, keys ...string) map[string]string {
		m := map[string]string{}
		for i := r.IntN(4); i > 0; i-- {
			v := pick("a", "b", "true", "rbd-nbd", "")
			if long && r.IntN(2) == 0 {
				v = fmt.Sprintf("csi-vol-%08d-5d6b-4c1a-9e7f-0a1b2c3d4e5f", r.IntN(1e8))
			}
			m[pick(keys...)] = v
		}
		return m
	}
	c := NewLocalCaches()
	add := func(o runtime.Object) {
		if err := c.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"gold", "silver"} {
		add(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Parameters: strs(false, "mounter", "pool")})
	}
	for _, name := range []string{"n1", "n2"} {
		add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: strs(false, "zone", "rack")}})
	}
	modes := [][]corev1.PersistentVolumeAccessMode{nil, {corev1.ReadWriteOnce}, {corev1.ReadWriteMany},
		{corev1.ReadWriteOnce, corev1.ReadOnlyMany}}
	for i := range 300 {
		name := fmt.Sprintf("pv-%d", i)
		p := pv(name, pick("gold", "silver", "bronze", ""), "d", corev1.VolumeBound)
		p.Spec.CSI.VolumeAttributes = strs(true, "mounter", "pool", "imageName", "clusterID")
		p.Spec.AccessModes = modes[r.IntN(len(modes))]
		if r.IntN(2) == 0 {
			p.Spec.MountOptions = []string{pick("discard", "noatime")}
		}
		add(p)
		if r.IntN(5) > 0 {
			add(&corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "claim-" + name,
					Labels: strs(true, "app", "tier"), Annotations: strs(true, "owner", "pv.kubernetes.io/bind-completed")},
				Spec: corev1.PersistentVolumeClaimSpec{VolumeName: name},
			})
		}
		add(va(name, "d", pick("n1", "n2", "n3"), true))
	}
	p := New(c)
	driver := policy.DriverInfo{Name: "d", Healer: policy.HealerCapabilities{Probe: true, Attributes: map[string]string{"healMounters": "rbd-nbd"}}}
	seen := 0
	for _, node := range []string{"n1", "n2", "n3"} {
		vols, _ := p.NodeVolumes("d", node)
		for _, v := range vols {
			o := v.Objects()
			want := policy.BuildInput(o.PV, o.PVC, o.StorageClass, o.Attachment, o.Node, driver, policy.TriggerRestart)
			got := v.PolicyInput(driver, policy.TriggerRestart)
			if g, w := got.RegoValue(), want.RegoValue(); g.Compare(w) != 0 {
				t.Fatalf("%s: the policy would see\n%v\nwant\n%v", v.PVName, g, w)
			}
			seen++
		}
	}
	if seen != 300 {
		t.Fatalf("compared %d volumes, want 300", seen)
	}
}

// TestPVNamesByHandle maps the handles a sidecar listed without PV names to PVs of the driver,
// the first by name when several share one, and leaves unknown handles and other drivers' out.
func TestPVNamesByHandle(t *testing.T) {
	shared := func(name string) *corev1.PersistentVolume {
		p := pv(name, "cephfs", "cephfs", corev1.VolumeBound)
		p.Spec.CSI.VolumeHandle = "shared"
		return p
	}
	p := newTestPlanner(t,
		pv("f1", "cephfs", "cephfs", corev1.VolumeBound), shared("f3-static"), shared("f2-static"),
		pv("r1", "rbd-nbd", "rbd", corev1.VolumeBound),
	)
	got := p.PVNamesByHandle("cephfs", []string{"h-f1", "shared", "h-r1", "h-gone"})
	want := map[string]string{"h-f1": "f1", "shared": "f2-static"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("PVNamesByHandle = %v, want %v", got, want)
	}
}
