package propagation

import (
	"encoding/json"
	"reflect"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
)

func prop(p corev1.MountPropagationMode) *corev1.MountPropagationMode { return &p }

// vm is a volumeMount of volume at path with propagation p (nil: unset).
func vm(volume, path string, p *corev1.MountPropagationMode) corev1.VolumeMount {
	return corev1.VolumeMount{Name: volume, MountPath: path, MountPropagation: p}
}

// TestPatch checks the JSONPatch for pods of several shapes, applies it to the pod as the API
// server does, and compares the mounts' propagation afterwards with what a user expects.
func TestPatch(t *testing.T) {
	hostToContainer, none, bidirectional := prop(corev1.MountPropagationHostToContainer), prop(corev1.MountPropagationNone), prop(corev1.MountPropagationBidirectional)
	tests := map[string]struct {
		spec corev1.PodSpec
		set  map[string]bool
		// want is the propagation of every mount after the patch, container by container,
		// "" for unset.
		want    map[string][]string
		wantOps []PatchOperation
	}{
		"nothing asked: no patch": {
			spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", VolumeMounts: []corev1.VolumeMount{vm("data", "/data", nil)}}}},
			want: map[string][]string{"app": {""}},
		},
		"the policy said false: no patch": {
			spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", VolumeMounts: []corev1.VolumeMount{vm("data", "/data", nil)}}}},
			set:  map[string]bool{"data": false},
			want: map[string][]string{"app": {""}},
		},
		"unset: added": {
			spec:    corev1.PodSpec{Containers: []corev1.Container{{Name: "app", VolumeMounts: []corev1.VolumeMount{vm("data", "/data", nil)}}}},
			set:     map[string]bool{"data": true},
			want:    map[string][]string{"app": {"HostToContainer"}},
			wantOps: []PatchOperation{{"add", "/spec/containers/0/volumeMounts/0/mountPropagation", "HostToContainer"}},
		},
		"None: replaced": {
			spec:    corev1.PodSpec{Containers: []corev1.Container{{Name: "app", VolumeMounts: []corev1.VolumeMount{vm("data", "/data", none)}}}},
			set:     map[string]bool{"data": true},
			want:    map[string][]string{"app": {"HostToContainer"}},
			wantOps: []PatchOperation{{"replace", "/spec/containers/0/volumeMounts/0/mountPropagation", "HostToContainer"}},
		},
		"already HostToContainer and Bidirectional: untouched": {
			spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", VolumeMounts: []corev1.VolumeMount{
				vm("data", "/data", hostToContainer), vm("data", "/mirror", bidirectional)}}}},
			set:  map[string]bool{"data": true},
			want: map[string][]string{"app": {"HostToContainer", "Bidirectional"}},
		},
		"several volumes, only the asked ones": {
			spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", VolumeMounts: []corev1.VolumeMount{
				vm("config", "/etc/app", nil), vm("data", "/data", nil), vm("cache", "/cache", none), vm("logs", "/logs", nil)}}}},
			set:  map[string]bool{"data": true, "cache": true, "logs": false},
			want: map[string][]string{"app": {"", "HostToContainer", "HostToContainer", ""}},
			wantOps: []PatchOperation{
				{"add", "/spec/containers/0/volumeMounts/1/mountPropagation", "HostToContainer"},
				{"replace", "/spec/containers/0/volumeMounts/2/mountPropagation", "HostToContainer"},
			},
		},
		"one volume mounted by two containers and an init container": {
			spec: corev1.PodSpec{
				InitContainers: []corev1.Container{{Name: "restore", VolumeMounts: []corev1.VolumeMount{vm("data", "/data", nil)}}},
				Containers: []corev1.Container{
					{Name: "app", VolumeMounts: []corev1.VolumeMount{vm("data", "/data", nil)}},
					{Name: "backup", VolumeMounts: []corev1.VolumeMount{vm("scratch", "/tmp", nil), vm("data", "/backup/data", none)}},
				},
			},
			set:  map[string]bool{"data": true},
			want: map[string][]string{"restore": {"HostToContainer"}, "app": {"HostToContainer"}, "backup": {"", "HostToContainer"}},
			wantOps: []PatchOperation{
				{"add", "/spec/initContainers/0/volumeMounts/0/mountPropagation", "HostToContainer"},
				{"add", "/spec/containers/0/volumeMounts/0/mountPropagation", "HostToContainer"},
				{"replace", "/spec/containers/1/volumeMounts/1/mountPropagation", "HostToContainer"},
			},
		},
		"ephemeral container": {
			spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "app"}},
				EphemeralContainers: []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
					Name: "debug", VolumeMounts: []corev1.VolumeMount{vm("data", "/data", nil)}}}},
			},
			set:     map[string]bool{"data": true},
			want:    map[string][]string{"app": nil, "debug": {"HostToContainer"}},
			wantOps: []PatchOperation{{"add", "/spec/ephemeralContainers/0/volumeMounts/0/mountPropagation", "HostToContainer"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ops := Patch(&tc.spec, tc.set)
			if !reflect.DeepEqual(ops, tc.wantOps) {
				t.Errorf("patch = %+v, want %+v", ops, tc.wantOps)
			}
			got := applied(t, &tc.spec, ops)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("propagation after the patch = %v, want %v", got, tc.want)
			}
		})
	}
}

// applied applies ops to a pod of spec as the API server does and returns each container's
// mount propagations.
func applied(t *testing.T, spec *corev1.PodSpec, ops []PatchOperation) map[string][]string {
	t.Helper()
	doc, err := json.Marshal(&corev1.Pod{Spec: *spec})
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) > 0 {
		patchJSON, err := json.Marshal(ops)
		if err != nil {
			t.Fatal(err)
		}
		p, err := jsonpatch.DecodePatch(patchJSON)
		if err != nil {
			t.Fatalf("the patch %s does not decode: %v", patchJSON, err)
		}
		if doc, err = p.Apply(doc); err != nil {
			t.Fatalf("the patch %s does not apply: %v", patchJSON, err)
		}
	}
	var pod corev1.Pod
	if err := json.Unmarshal(doc, &pod); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	record := func(name string, mounts []corev1.VolumeMount) {
		out[name] = nil
		for _, m := range mounts {
			p := ""
			if m.MountPropagation != nil {
				p = string(*m.MountPropagation)
			}
			out[name] = append(out[name], p)
		}
	}
	for _, c := range pod.Spec.InitContainers {
		record(c.Name, c.VolumeMounts)
	}
	for _, c := range pod.Spec.Containers {
		record(c.Name, c.VolumeMounts)
	}
	for _, c := range pod.Spec.EphemeralContainers {
		record(c.Name, c.VolumeMounts)
	}
	return out
}
