package policy

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/volume-healer/volume-healer/api/annotations"
)

// claimVolume is a bound CSI volume named name of class fast with one mount of propagation p.
func claimVolume(name, driver string, scLabels map[string]string, p string) ClaimVolume {
	return ClaimVolume{Name: name, Claim: name + "-claim", PersistentVolume: "pv-" + name, Driver: driver,
		StorageClass: &ClassInfo{Name: "fast", Labels: scLabels},
		Mounts:       []VolumeMountInfo{{Container: "app", ContainerKind: "container", MountPath: "/" + name, Propagation: p}}}
}

// TestPropagationDecisionOfTheBuiltinPolicy: the built-in policy sets HostToContainer only on
// bound CSI volumes whose StorageClass or namespace opted in, and only where a mount has no
// propagation or None.
func TestPropagationDecisionOfTheBuiltinPolicy(t *testing.T) {
	ctx := context.Background()
	rev, err := Compile(ctx, DefaultModules(), patient(CompileOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	if !rev.DefinesPropagation() {
		t.Fatal("the built-in policy defines no propagation rule")
	}
	optIn := map[string]string{annotations.MountPropagationLabel: annotations.MountPropagationHostToContainer}
	tests := map[string]struct {
		nsLabels map[string]string
		volume   ClaimVolume
		want     PropagationDecision
	}{
		"not opted in":                {volume: claimVolume("data", "rbd.csi.ceph.com", nil, ""), want: PropagationDecision{false, "NotOptedIn"}},
		"StorageClass opted in":       {volume: claimVolume("data", "rbd.csi.ceph.com", optIn, ""), want: PropagationDecision{true, "StorageClassOptedIn"}},
		"namespace opted in, None":    {nsLabels: optIn, volume: claimVolume("data", "rbd.csi.ceph.com", nil, "None"), want: PropagationDecision{true, "NamespaceOptedIn"}},
		"opted in, other label value": {volume: claimVolume("data", "rbd.csi.ceph.com", map[string]string{annotations.MountPropagationLabel: "true"}, ""), want: PropagationDecision{false, "NotOptedIn"}},
		"opted in, not CSI":           {nsLabels: optIn, volume: claimVolume("data", "", optIn, ""), want: PropagationDecision{false, "NotCSI"}},
		"opted in, claim not bound, CSI provisioner": {nsLabels: optIn, volume: ClaimVolume{Name: "data", Claim: "new", Driver: "rbd.csi.ceph.com",
			Mounts: []VolumeMountInfo{{Container: "app", ContainerKind: "container", MountPath: "/data"}}}, want: PropagationDecision{true, "NamespaceOptedIn"}},
		"opted in, claim not bound, other provisioner": {nsLabels: optIn, volume: ClaimVolume{Name: "data", Claim: "new",
			Mounts: []VolumeMountInfo{{Container: "app", ContainerKind: "container", MountPath: "/data"}}}, want: PropagationDecision{false, "NotCSI"}},
		"opted in, already HostToContainer": {nsLabels: optIn, volume: claimVolume("data", "rbd.csi.ceph.com", optIn, "HostToContainer"), want: PropagationDecision{false, "NoMountToChange"}},
		"opted in, Bidirectional":           {nsLabels: optIn, volume: claimVolume("data", "rbd.csi.ceph.com", optIn, "Bidirectional"), want: PropagationDecision{false, "NoMountToChange"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := PropagationInput{Pod: AdmittedPod{Namespace: "shop", GenerateName: "web-", OwnerKind: "ReplicaSet"},
				Namespace: Labeled{Name: "shop", Labels: tc.nsLabels}, Volumes: []ClaimVolume{tc.volume}}
			got, err := rev.DecidePropagation(ctx, &in)
			if err != nil {
				t.Fatal(err)
			}
			if want := (PropagationDecisions{"data": tc.want}); !maps.Equal(got, want) {
				t.Errorf("decisions = %+v, want %+v", got, want)
			}
		})
	}
}

// TestPropagationDecisionOfAPolicy: a policy without a propagation rule changes no pod, and a
// policy whose propagation output is not the documented object is refused when it loads, with an
// error that names the problem.
func TestPropagationDecisionOfAPolicy(t *testing.T) {
	ctx := context.Background()
	in := PropagationInput{Pod: AdmittedPod{Namespace: "shop", Name: "web-1"}, Namespace: Labeled{Name: "shop"},
		Volumes: []ClaimVolume{claimVolume("data", "rbd.csi.ceph.com", nil, "")}}
	tests := map[string]struct {
		rules       string
		want        PropagationDecisions
		wantDefined bool
		wantErr     string
	}{
		"no propagation rule": {want: PropagationDecisions{}},
		"every volume": {rules: `propagation[v.name] := {"set": true, "reason": "Everywhere"} if some v in input.volumes`,
			want: PropagationDecisions{"data": {true, "Everywhere"}}, wantDefined: true},
		"reads the claim": {rules: `propagation[v.name] := {"set": true, "reason": v.claim} if some v in input.volumes`,
			want: PropagationDecisions{"data": {true, "data-claim"}}, wantDefined: true},
		"an empty driver breaks it": {rules: `propagation[v.name] := {"set": true, "reason": v.driver} if some v in input.volumes`,
			wantErr: `volume "nfs": reason "" is not a non-empty string`},
		"unknown volume":  {rules: `propagation := {"other": {"set": true, "reason": "x"}}`, wantErr: `key "other" is not the name of one of the pod's claim volumes`},
		"set not boolean": {rules: `propagation[v.name] := {"set": "yes", "reason": "x"} if some v in input.volumes`, wantErr: `set "yes" is not a boolean`},
		"no reason":       {rules: `propagation[v.name] := {"set": true} if some v in input.volumes`, wantErr: "reason is missing"},
		"no set":          {rules: `propagation[v.name] := {"reason": "x"} if some v in input.volumes`, wantErr: "set is missing"},
		"unknown key":     {rules: `propagation[v.name] := {"set": true, "reason": "x", "mode": "Bidirectional"} if some v in input.volumes`, wantErr: `unknown key "mode"`},
		"not an object":   {rules: `propagation := true`, wantErr: "want an object of volume names"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			src := "package volumehealer\n\ndecision := data.volumehealer.builtin.decision\n\n" + tc.rules + "\n"
			rev, err := Compile(ctx, []Module{{File: "site.rego", Text: src}}, patient(CompileOptions{}))
			if tc.wantErr != "" {
				// Refused before it serves: the propagation rule is evaluated on canned pods at load.
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrInvalidDecision) {
					t.Fatalf("Compile = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := rev.DecidePropagation(ctx, &in)
			if err != nil || !maps.Equal(got, tc.want) {
				t.Fatalf("propagation decisions = %+v, %v; want %+v", got, err, tc.want)
			}
			if rev.DefinesPropagation() != tc.wantDefined {
				t.Errorf("DefinesPropagation = %t, want %t", rev.DefinesPropagation(), tc.wantDefined)
			}
		})
	}
}

// TestPropagationRuleCheckedBeforeServing: a propagation rule that fails for an ordinary pod is
// refused when the policy loads, naming the file and the query.
func TestPropagationRuleCheckedBeforeServing(t *testing.T) {
	src := `package volumehealer

decision := data.volumehealer.builtin.decision

propagation[v.name] := {"set": true, "reason": "x"} if {
	some v in input.volumes
	1 / count(v.driver) > 0
}
`
	_, err := Compile(context.Background(), []Module{{File: "site.rego", Text: src}}, patient(CompileOptions{}))
	var le *LoadError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "divide by zero") || !strings.Contains(err.Error(), PropagationQuery) {
		t.Fatalf("Compile = %v, want a LoadError about %s: divide by zero", err, PropagationQuery)
	}
}

// TestPropagationInputJSON pins the input document the documentation describes.
func TestPropagationInputJSON(t *testing.T) {
	in := PropagationInput{
		Pod:       AdmittedPod{Namespace: "shop", GenerateName: "web-", OwnerKind: "ReplicaSet", Labels: map[string]string{"app": "web"}},
		Namespace: Labeled{Name: "shop"},
		Volumes: []ClaimVolume{
			{Name: "data", Claim: "data", PersistentVolume: "pv-1", Driver: "rbd.csi.ceph.com",
				StorageClass: &ClassInfo{Name: "fast", Parameters: map[string]string{"mounter": "rbd-nbd"}},
				Mounts:       []VolumeMountInfo{{Container: "app", ContainerKind: "container", MountPath: "/data", Propagation: "None"}}},
			{Name: "pending", Claim: "new", Mounts: []VolumeMountInfo{}},
		},
	}
	got, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"namespace":{"labels":{},"name":"shop"},` +
		`"pod":{"generateName":"web-","labels":{"app":"web"},"name":"","namespace":"shop","ownerKind":"ReplicaSet"},` +
		`"volumes":[{"claim":"data","driver":"rbd.csi.ceph.com","mounts":[{"container":"app","containerKind":"container","mountPath":"/data","propagation":"None"}],` +
		`"name":"data","persistentVolume":"pv-1","storageClass":{"labels":{},"name":"fast","parameters":{"mounter":"rbd-nbd"}}},` +
		`{"claim":"new","driver":"","mounts":[],"name":"pending","persistentVolume":""}]}`
	if string(got) != want {
		t.Errorf("input JSON\n got %s\nwant %s", got, want)
	}
}
