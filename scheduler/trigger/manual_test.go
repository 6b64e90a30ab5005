package trigger

import (
	"context"
	"testing"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/scheduler"
)

func TestManualRequests(t *testing.T) {
	req := func(value, handled string) map[string]string {
		a := map[string]string{}
		if value != "" {
			a[annotations.SweepRequest] = value
		}
		if handled != "" {
			a[annotations.SweepHandled] = handled
		}
		return a
	}
	tests := map[string]struct {
		obj  client.Object
		want *scheduler.Sweep
	}{
		"PVC: its volume": {
			obj: &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db", Annotations: req("r1", "")},
				Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-db"}},
			want: &scheduler.Sweep{Trigger: scheduler.TriggerManual, PV: "pv-db", Marker: "r1"},
		},
		"StorageClass: its volumes": {
			obj:  &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold", Annotations: req("r2", "r1")}},
			want: &scheduler.Sweep{Trigger: scheduler.TriggerManual, StorageClass: "gold", Marker: "r2"},
		},
		"CSIAddonsNode: its driver on its node": {
			obj: &csiaddonsv1alpha1.CSIAddonsNode{ObjectMeta: metav1.ObjectMeta{Namespace: "csi", Name: "n", Annotations: req("r3", "")},
				Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{Name: "rbd", NodeID: "node-a"}}},
			want: &scheduler.Sweep{Trigger: scheduler.TriggerManual, Driver: "rbd", Node: "node-a", Marker: "r3"},
		},
		"request already handled": {
			obj: &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold", Annotations: req("r2", "r2")}},
		},
		"no request": {
			obj: &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold"}},
		},
		"unbound PVC": {
			obj: &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db", Annotations: req("r1", "")}},
		},
		"request under the key of 0.1.0": {
			obj: &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold", Annotations: map[string]string{
				annotations.Previous(annotations.SweepRequest): "r4"}}},
			want: &scheduler.Sweep{Trigger: scheduler.TriggerManual, StorageClass: "gold", Marker: "r4"},
		},
		"request 0.1.0 handled": {
			obj: &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold", Annotations: map[string]string{
				annotations.Previous(annotations.SweepRequest): "r4", annotations.Previous(annotations.SweepHandled): "r4"}}},
		},
		"new request after one 0.1.0 handled": {
			obj: &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold", Annotations: map[string]string{
				annotations.Previous(annotations.SweepRequest): "r4", annotations.Previous(annotations.SweepHandled): "r4",
				annotations.SweepRequest: "r5"}}},
			want: &scheduler.Sweep{Trigger: scheduler.TriggerManual, StorageClass: "gold", Marker: "r5"},
		},
		"request under the key of 0.1.0 handled under the new key": {
			obj: &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold", Annotations: map[string]string{
				annotations.Previous(annotations.SweepRequest): "r4", annotations.SweepHandled: "r4"}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var got []scheduler.Sweep
			m, err := NewManual(ManualOptions{Sweeps: func(s scheduler.Sweep) { got = append(got, s) }})
			if err != nil {
				t.Fatal(err)
			}
			m.Observe(context.Background(), tc.obj)
			m.Observe(context.Background(), tc.obj) // a resync does not start it twice
			if tc.want == nil {
				if len(got) != 0 {
					t.Fatalf("sweeps = %+v, want none", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("sweeps = %+v, want one", got)
			}
			s := got[0]
			if s.Trigger != tc.want.Trigger || s.PV != tc.want.PV || s.StorageClass != tc.want.StorageClass ||
				s.Driver != tc.want.Driver || s.Node != tc.want.Node || s.Marker != tc.want.Marker || s.Requester != tc.obj {
				t.Fatalf("sweep = %+v, want %+v requested by the object", s, *tc.want)
			}
		})
	}
}

func TestManualNewRequestAfterHandled(t *testing.T) {
	var got []scheduler.Sweep
	m, _ := NewManual(ManualOptions{Sweeps: func(s scheduler.Sweep) { got = append(got, s) }})
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold", Annotations: map[string]string{annotations.SweepRequest: "r1"}}}
	m.Observe(context.Background(), sc)
	sc.Annotations[annotations.SweepHandled] = "r1"
	m.Observe(context.Background(), sc)
	sc.Annotations[annotations.SweepRequest] = "r2"
	m.Observe(context.Background(), sc)
	if len(got) != 2 || got[1].Marker != "r2" {
		t.Fatalf("sweeps = %+v, want r1 then r2", got)
	}
}
