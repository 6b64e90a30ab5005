package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/test/controlplane"
)

// healerctl runs the healerctl command line args and returns what it printed and its error.
func healerctl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return healerctlIn(t, "", args...)
}

// TestPolicyExplainPod runs `healerctl policy explain PV --pod POD` against a real apiserver: the
// restart decision for a pod of the volume's claim after a heal, read from the cluster (the
// namespace's opt-in label, the pod's owner, the StorageClass), as the evictor would make it with
// the built-in policy, and errors that say which pod or volume is wrong.
func TestPolicyExplainPod(t *testing.T) {
	env := controlplane.Start(t)
	c := statusCluster{t: t, env: env}
	c.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{annotations.EvictPodsLabel: "true"}}})
	c.create(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: statusDriver})
	for _, name := range []string{"data", "spare"} {
		pv := persistentVolume(name)
		pv.Spec.StorageClassName = "fast"
		if name == "data" {
			pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "shop", Name: name}
		}
		c.create(pv)
	}
	fast := "fast"
	c.create(&corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "data"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			StorageClassName: &fast,
			VolumeName:       "pv-data",
		},
	})
	yes := true
	c.create(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1", OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web", UID: types.UID("3b5f1c2e-0d4e-4b7a-9c1f-6a2d8e9f0a11"), Controller: &yes}}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "web", Image: "web"}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}},
		},
	})

	explain := []string{"policy", "explain", "--kubeconfig", env.Kubeconfig, "--node", "node-1", "--time", "2026-12-01T03:00:00Z"}
	tests := map[string]struct {
		args    []string
		want    []string
		wantErr string
	}{
		"a pod of an opted-in namespace with a controller is evicted": {
			args: []string{"pv-data", "--pod", "web-1"},
			want: []string{
				"volume: pv-data (driver " + statusDriver + ", node node-1), trigger restart, after a probe (healthy: false)",
				"pod: shop/web-1 (owner ReplicaSet, disruption budget: false), time 2026-12-01T03:00:00Z",
				"namespace labels: kubernetes.io/metadata.name=shop, " + annotations.EvictPodsLabel + "=true",
				`restart decision: {"action":"evict","reason":"NamespaceOptedIn"}`,
				"data.volumehealer.builtin.restart",
			},
		},
		"a pod that does not exist": {
			args:    []string{"pv-data", "--pod", "web-2"},
			wantErr: "reading pod shop/web-2",
		},
		"a volume bound to no claim": {
			args:    []string{"pv-spare", "--pod", "web-1"},
			wantErr: "--pod web-1: PersistentVolume pv-spare is not bound to a claim",
		},
		"a time that is not RFC 3339": {
			args:    []string{"pv-data", "--pod", "web-1", "--time", "3am"},
			wantErr: `--time "3am" is not an RFC 3339 time`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out, err := healerctl(t, append(explain, tc.args...)...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("healerctl policy explain %s: %v, want an error containing %q\n%s", strings.Join(tc.args, " "), err, tc.wantErr, out)
				}
				return
			}
			if err != nil {
				t.Fatalf("healerctl policy explain %s: %v\n%s", strings.Join(tc.args, " "), err, out)
			}
			mustContain(t, out, tc.want...)
		})
	}
}

// TestPolicyExplainJSONFeedsEval runs `healerctl policy explain -o json` for a claim of a real
// apiserver, feeds what it prints to `healerctl policy eval --input -`, and checks that eval
// decides what explain says it decides; and that a claim is named the ways kubectl users name it.
func TestPolicyExplainJSONFeedsEval(t *testing.T) {
	env := controlplane.Start(t)
	c := statusCluster{t: t, env: env}
	c.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
	c.create(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: statusDriver})
	pv := persistentVolume("data")
	pv.Spec.StorageClassName = "fast"
	pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "shop", Name: "data"}
	c.create(pv)
	fast := "fast"
	for _, name := range []string{"data", "pending"} {
		claim := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
				StorageClassName: &fast,
			},
		}
		if name == "data" {
			claim.Spec.VolumeName = pv.Name
		}
		c.create(claim)
	}

	kube := []string{"--kubeconfig", env.Kubeconfig, "--node", "node-1"}
	for name, extra := range map[string][]string{
		"restart sweep":                   nil,
		"scheduled sweep":                 {"--trigger", "schedule"},
		"after a probe found it unusable": {"--probe", "INACCESSIBLE"},
	} {
		t.Run(name, func(t *testing.T) {
			explain := append(append([]string{"policy", "explain", "-n", "shop", "pvc/data"}, kube...), extra...)
			text, err := healerctl(t, explain...)
			if err != nil {
				t.Fatalf("healerctl %s: %v\n%s", strings.Join(explain, " "), err, text)
			}
			_, said, ok := strings.Cut(text, "\ndecision: ")
			if !ok {
				t.Fatalf("explain printed no decision:\n%s", text)
			}
			said, _, _ = strings.Cut(said, "\n")

			input, err := healerctl(t, append(explain, "-o", "json")...)
			if err != nil {
				t.Fatalf("explain -o json: %v\n%s", err, input)
			}
			var doc map[string]any
			if err := json.Unmarshal([]byte(input), &doc); err != nil {
				t.Fatalf("explain -o json printed no JSON document: %v\n%s", err, input)
			}
			vol, _ := doc["volume"].(map[string]any)
			claim, _ := vol["pvc"].(map[string]any)
			if vol["pv"] != "pv-data" || claim["namespace"] != "shop" || claim["name"] != "data" {
				t.Errorf("the input is not that of pv-data, bound to shop/data:\n%s", input)
			}

			decided, err := healerctlIn(t, input, "policy", "eval", "--input", "-")
			if err != nil {
				t.Fatalf("policy eval --input - of explain's input: %v\n%s", err, decided)
			}
			assertSameJSON(t, said, decided)
		})
	}

	t.Run("--pvc and the argument name the same volume", func(t *testing.T) {
		byArg, err := healerctl(t, append([]string{"policy", "explain", "-o", "json", "pv-data"}, kube...)...)
		if err != nil {
			t.Fatal(err)
		}
		byFlag, err := healerctl(t, append([]string{"policy", "explain", "-o", "json", "--namespace=shop", "--pvc", "data"}, kube...)...)
		if err != nil {
			t.Fatal(err)
		}
		assertSameJSON(t, byArg, byFlag)
	})

	for name, tc := range map[string]struct {
		args    []string
		wantErr string
	}{
		"a claim that is not bound":              {[]string{"-n", "shop", "pvc/pending"}, "PersistentVolumeClaim shop/pending is not bound to a volume"},
		"a claim that does not exist":            {[]string{"-n", "shop", "--pvc", "gone"}, "reading PersistentVolumeClaim shop/gone"},
		"the claim's namespace from the context": {[]string{"pvc/data"}, "reading PersistentVolumeClaim default/data"},
		"two volumes":                            {[]string{"-n", "shop", "pv-data", "--pvc", "data"}, "pv-data and --pvc data both name a volume"},
		"no volume":                              {nil, "name the volume"},
		"another kind":                           {[]string{"pod/web-1"}, "pod/web-1: want a PersistentVolume (pv/NAME) or a PersistentVolumeClaim (pvc/NAME)"},
		"an unknown output":                      {[]string{"pv-data", "-o", "yaml"}, `--output "yaml": want text or json`},
		"json for a pod's decision":              {[]string{"pv-data", "-o", "json", "--pod", "web-1"}, "drop --pod"},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := healerctl(t, append(append([]string{"policy", "explain"}, kube...), tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("healerctl policy explain %s: %v, want an error containing %q\n%s", strings.Join(tc.args, " "), err, tc.wantErr, out)
			}
		})
	}
}

// healerctlIn is healerctl with stdin as the standard input.
func healerctlIn(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := newRootCommand("healerctl")
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// assertSameJSON fails t unless the JSON documents a and b are equal.
func assertSameJSON(t *testing.T, a, b string) {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal([]byte(a), &va); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, a)
	}
	if err := json.Unmarshal([]byte(b), &vb); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b)
	}
	if !reflect.DeepEqual(va, vb) {
		t.Errorf("different documents:\n%s\n%s", a, b)
	}
}
