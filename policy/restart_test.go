package policy

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/volume-healer/volume-healer/api/annotations"
)

// restartPod is a running pod of namespace shop, owned by a controller of kind owner (bare when
// empty).
func restartPod(name, owner string, labels map[string]string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: labels}}
	if owner != "" {
		yes := true
		p.OwnerReferences = []metav1.OwnerReference{
			{APIVersion: "v1", Kind: "ConfigMap", Name: "not-the-controller"},
			{APIVersion: "apps/v1", Kind: owner, Name: name + "-owner", Controller: &yes},
		}
	}
	return p
}

// TestRestartDecisionOfTheBuiltinPolicy reads the opt-in labels, the owner and the disruption
// budgets from a cluster as the evictor and `healerctl policy explain --pod` do, and checks what
// the built-in policy decides, and what its explanation shows.
func TestRestartDecisionOfTheBuiltinPolicy(t *testing.T) {
	ctx := context.Background()
	rev, err := Compile(ctx, DefaultModules(), patient(CompileOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	optIn := map[string]string{annotations.EvictPodsLabel: "true"}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db"},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
	}
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	in := Input{Trigger: TriggerRestart, Volume: Volume{PV: "pv-1", Driver: "rbd.csi.ceph.com",
		StorageClass: &StorageClass{Name: "fast"}, PVC: &Claim{Namespace: "shop", Name: "data"}}}
	tests := map[string]struct {
		nsLabels, scLabels map[string]string
		pod                *corev1.Pod
		want               RestartDecision
		wantBudget         bool
	}{
		"not opted in: left alone": {pod: restartPod("web-1", "ReplicaSet", nil),
			want: RestartDecision{RestartLeave, "NotOptedIn"}},
		"StorageClass opted in: evicted": {scLabels: optIn, pod: restartPod("web-1", "ReplicaSet", nil),
			want: RestartDecision{RestartEvict, "StorageClassOptedIn"}},
		"namespace opted in: evicted, budget seen": {nsLabels: optIn, pod: restartPod("db-0", "StatefulSet", map[string]string{"app": "db"}),
			want: RestartDecision{RestartEvict, "NamespaceOptedIn"}, wantBudget: true},
		"bare pod: never evicted": {nsLabels: optIn, scLabels: optIn, pod: restartPod("debug", "", nil),
			want: RestartDecision{RestartLeave, "NoController"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			client := fake.NewClientset(
				&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: tc.nsLabels}},
				&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast", Labels: tc.scLabels}},
				pdb,
			)
			scope, err := ReadPodScope(ctx, client, "shop", "fast")
			if err != nil {
				t.Fatal(err)
			}
			rin := scope.Input(in, tc.pod, now)
			if rin.Pod.DisruptionBudget != tc.wantBudget {
				t.Errorf("disruptionBudget = %t, want %t", rin.Pod.DisruptionBudget, tc.wantBudget)
			}
			got, err := rev.DecideRestart(ctx, &rin)
			if err != nil || got != tc.want {
				t.Fatalf("restart decision = %+v, %v; want %+v", got, err, tc.want)
			}
			x, err := rev.ExplainRestart(ctx, &rin)
			if err != nil || x.Err != nil {
				t.Fatalf("explain: %v, %v", err, x.Err)
			}
			var out bytes.Buffer
			if err := x.WriteText(&out, false); err != nil {
				t.Fatal(err)
			}
			for _, s := range []string{"pod: shop/" + tc.pod.Name, `restart decision: {"action":"` + string(tc.want.Action) + `","reason":"` + tc.want.Reason + `"}`,
				"time 2026-12-01T03:00:00Z", "data.volumehealer.builtin.restart"} {
				if !strings.Contains(out.String(), s) {
					t.Errorf("explanation lacks %q:\n%s", s, out.String())
				}
			}
		})
	}
}

// TestRestartDecisionOfAPolicy: a policy without a restart rule leaves every pod alone, and a
// policy whose restart output is not the documented object is refused when it loads, with an
// error that names the problem.
func TestRestartDecisionOfAPolicy(t *testing.T) {
	ctx := context.Background()
	rin := RestartInput{Input: Input{Trigger: TriggerRestart, Remedies: Remedies{RestartContainers: true}}, Remedy: RemedyRecycle, Finding: "MountGone",
		Pod: Pod{Namespace: "shop", Name: "web-1", OwnerKind: "ReplicaSet", RestartPolicy: "Always"}, Time: time.Now()}
	tests := map[string]struct {
		rules   string
		want    RestartDecision
		wantErr string
	}{
		"no restart rule":  {want: RestartDecision{RestartLeave, RestartNoRule}},
		"evict":            {rules: `restart := {"action": "evict", "reason": "Always"}`, want: RestartDecision{RestartEvict, "Always"}},
		"reads the pod":    {rules: `restart := {"action": "leave", "reason": concat(":", ["owner", input.pod.ownerKind])}`, want: RestartDecision{RestartLeave, "owner:ReplicaSet"}},
		"restart in place": {rules: `restart := {"action": "restartContainers", "reason": "x"}`, want: RestartDecision{RestartContainers, "x"}},
		"reads the remedy": {rules: `restart := {"action": "leave", "reason": concat(":", [input.remedy, input.finding, input.pod.restartPolicy, format_int(to_number(input.remedies.restartContainers), 10)])}`,
			want: RestartDecision{RestartLeave, "recycle:MountGone:Always:1"}},
		"unknown action":   {rules: `restart := {"action": "delete", "reason": "x"}`, wantErr: `action "delete" is not one of restartContainers, evict, leave`},
		"no reason":        {rules: `restart := {"action": "evict"}`, wantErr: "reason is missing"},
		"not an object":    {rules: `restart := "evict"`, wantErr: "want an object with action and reason"},
		"unknown key":      {rules: `restart := {"action": "evict", "reason": "x", "grace": 0}`, wantErr: `unknown key "grace"`},
		"empty reason":     {rules: `restart := {"action": "evict", "reason": ""}`, wantErr: "is not a non-empty string"},
		"a number as kind": {rules: `restart := {"action": 1, "reason": "x"}`, wantErr: "action 1 is not one of restartContainers, evict, leave"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			src := "package volumehealer\n\ndecision := data.volumehealer.builtin.decision\n\n" + tc.rules + "\n"
			rev, err := Compile(ctx, []Module{{File: "site.rego", Text: src}}, patient(CompileOptions{}))
			if tc.wantErr != "" {
				// Refused before it serves: the restart rule is evaluated on canned pods at load.
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrInvalidDecision) {
					t.Fatalf("Compile = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := rev.DecideRestart(ctx, &rin)
			if err != nil || got != tc.want {
				t.Fatalf("restart decision = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestRestartInputNeedsARemedy: a restart input that names no remedy is refused, naming the field.
func TestRestartInputNeedsARemedy(t *testing.T) {
	ctx := context.Background()
	rev, err := Compile(ctx, DefaultModules(), patient(CompileOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	rin := RestartInput{Input: Input{Trigger: TriggerRestart}, Remedy: "reboot", Pod: Pod{Namespace: "shop", Name: "web-1"}}
	if _, err := rev.DecideRestart(ctx, &rin); err == nil || !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), `remedy "reboot" is not one of heal, recycle`) {
		t.Fatalf("DecideRestart = %v, want an invalid input error naming the remedy", err)
	}
}

// TestRestartRuleCheckedBeforeServing: a restart rule that fails for an ordinary pod (here a bare
// one) is refused when the policy loads, naming the file, as a broken decision rule is.
func TestRestartRuleCheckedBeforeServing(t *testing.T) {
	ctx := context.Background()
	tests := map[string]struct {
		rules   string
		wantErr string
	}{
		"bare pods break it": {`restart := {"action": "evict", "reason": concat("/", ["owner", input.pod.ownerKind])} if {
	1 / count(input.pod.ownerKind) > 0
}`, "divide by zero"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			src := "package volumehealer\n\ndecision := data.volumehealer.builtin.decision\n\n" + tc.rules + "\n"
			_, err := Compile(ctx, []Module{{File: "site.rego", Text: src}}, patient(CompileOptions{}))
			var le *LoadError
			if !errors.As(err, &le) || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), RestartQuery) {
				t.Fatalf("Compile = %v, want a LoadError about %s containing %q", err, RestartQuery, tc.wantErr)
			}
			if !slices.Contains(le.Files, "site.rego") {
				t.Errorf("the error blames %v, want site.rego", le.Files)
			}
		})
	}
}
