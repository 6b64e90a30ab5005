package policy

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
)

// TestCheckRefusesWhatTheControllerRefuses checks each kind of bad policy before it is stored,
// then stores it: Check refuses it with the kind the controller then writes on the ConfigMap, and
// its message holds the controller's message (file namespace/configmap/key and line) and names
// the ConfigMap. Checking the stored set again with only an annotation changed lets it through,
// as the controller's own status patch must pass.
func TestCheckRefusesWhatTheControllerRefuses(t *testing.T) {
	client := fake.NewClientset()
	engine, reg := newTestEngine(t, Options{})
	h := startConfigMapSource(t, client, record.NewFakeRecorder(100), engine)
	good := map[string]string{"policy.rego": skipPolicy("Good")}
	h.create(policyConfigMap("site-policy", good))
	h.decides("Good")
	h.status("site-policy", isOK)

	tests := map[string]struct {
		text string
		kind ErrorKind
		line string
	}{
		"a syntax error":        {policyText(`decision := {"action": "skip", "reason": "r"`), KindParse, ":4"},
		"an undefined function": {policyText(`decision := {"action": "skip", "reason": no_such_function(1)}`), KindCompile, ":3"},
		"a forbidden built-in": {policyText(`decision := {"action": "skip", "reason": r.body} if {`,
			`	r := http.send({"method": "GET", "url": "http://127.0.0.1:1/"})`, `}`), KindForbiddenBuiltin, ":4"},
		"a division by zero on a canned input": {policyText(`decision := {"action": "skip", "reason": "r", "priority": 10 / count(input.volume.mountOptions)}`), KindRuntime, ":3"},
		"conflicting decisions": {policyText(`decision := {"action": "skip", "reason": "everyone"}`,
			`decision := {"action": "probe", "reason": "restart"} if input.trigger == "restart"`), KindConflict, ""},
		"an unknown action":              {policyText(`decision := {"action": "repair", "reason": "r"}`), KindInvalidOutput, ""},
		"a decision undefined sometimes": {policyText(`decision := {"action": "probe", "reason": "r"} if input.trigger == "restart"`), KindUndefined, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			stored, err := client.CoreV1().ConfigMaps(testNamespace).Get(h.ctx, "site-policy", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			candidate := stored.DeepCopy()
			candidate.Data = map[string]string{"policy.rego": tc.text}
			checked := h.source.Check(h.ctx, candidate, stored)
			var le *LoadError
			if !errors.As(checked, &le) || le.Kind != tc.kind {
				t.Fatalf("Check: %v, want a rejection of kind %s", checked, tc.kind)
			}
			file := "volume-healer/site-policy/policy.rego" + tc.line
			if msg := checked.Error(); !strings.HasPrefix(msg, "ConfigMap volume-healer/site-policy: policy rejected ("+string(tc.kind)+")") || !strings.Contains(msg, file) {
				t.Errorf("Check: %q, want it to name the ConfigMap, the kind and %s", msg, file)
			}

			// The controller, given the same change, refuses it the same way.
			h.update("site-policy", candidate.Data)
			st := h.status("site-policy", func(st PolicyStatus) bool { return st.Status == StatusRejected && st.Reason == tc.kind })
			if !strings.Contains(checked.Error(), st.Error) {
				t.Errorf("the controller's message\n%s\nis not in the one Check gave:\n%s", st.Error, checked.Error())
			}

			// The controller's status patch on the rejected set changes no module: it passes.
			rejected, err := client.CoreV1().ConfigMaps(testNamespace).Get(h.ctx, "site-policy", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			annotated := rejected.DeepCopy()
			annotated.Annotations = map[string]string{"example.com/note": "looked at"}
			if err := h.source.Check(h.ctx, annotated, rejected); err != nil {
				t.Errorf("Check of an annotation written on the rejected set: %v, want nil", err)
			}

			h.update("site-policy", good)
			h.status("site-policy", isOK)
		})
	}
	if v := loadErrors(t, reg); v != float64(len(tests)) {
		t.Errorf("volume_healer_policy_load_errors_total = %v, want %d: Check must count nothing, the controller one per stored bad policy", v, len(tests))
	}
}

// TestCheckJudgesTheWholeSet: a change is judged with the other ConfigMaps of the set, and only
// changes to the set are judged.
func TestCheckJudgesTheWholeSet(t *testing.T) {
	client := fake.NewClientset()
	engine, reg := newTestEngine(t, Options{})
	h := startConfigMapSource(t, client, record.NewFakeRecorder(100), engine)
	h.create(policyConfigMap("site-policy", map[string]string{"policy.rego": policyText(`decision := {"action": "skip", "reason": helper_reason}`)}))
	h.create(policyConfigMap("zz-helpers", map[string]string{"helpers.rego": "package volumehealer\n\nhelper_reason := \"Helped\"\n"}))
	h.decides("Helped")
	serving := engine.Revision().ID()
	// site-policy alone, before zz-helpers arrived, may have been rejected: count from here.
	errorsBefore := loadErrors(t, reg)
	broken := map[string]string{"policy.rego": policyText(`decision := {"action": "skip", "reason": `)}

	tests := map[string]struct {
		cm, old *corev1.ConfigMap
		want    []string // substrings of the error; none: accepted
	}{
		"a good change": {
			cm: policyConfigMap("site-policy", map[string]string{"policy.rego": policyText(`decision := {"action": "skip", "reason": concat("-", [helper_reason, "Twice"])}`)}),
		},
		"a new ConfigMap that defines the decision again": {
			cm: policyConfigMap("second", map[string]string{"policy.rego": skipPolicy("Second")}),
			// The conflict is found at run time and blamed where OPA reports it, on the first
			// ConfigMap, as the controller's status annotations would.
			want: []string{"ConfigMap volume-healer/second: the policy set it joins is rejected because of ConfigMap volume-healer/site-policy",
				"policy rejected (conflict)", "conflicting values", "volume-healer/second/policy.rego:3"},
		},
		"a helper removed that the other ConfigMap uses": {
			cm:   policyConfigMap("zz-helpers", map[string]string{"helpers.rego": "package volumehealer\n\nother := 1\n"}),
			old:  policyConfigMap("zz-helpers", map[string]string{"helpers.rego": "package volumehealer\n\nhelper_reason := \"Helped\"\n"}),
			want: []string{"ConfigMap volume-healer/zz-helpers: the policy set it joins is rejected because of ConfigMap volume-healer/site-policy", "volume-healer/site-policy/policy.rego:3", "helper_reason"},
		},
		"every Rego key renamed": {
			cm:   policyConfigMap("zz-helpers", map[string]string{"helpers.txt": "package volumehealer\n"}),
			want: []string{"ConfigMap volume-healer/zz-helpers", "policy rejected (compile)", "helper_reason"},
		},
		"a broken policy without the label": {
			cm: &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "draft"}, Data: broken},
		},
		"the label removed from a broken policy": {
			cm:  &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "site-policy"}, Data: broken},
			old: policyConfigMap("site-policy", map[string]string{"policy.rego": policyText(`decision := {"action": "skip", "reason": helper_reason}`)}),
		},
		"a broken policy in another namespace": {
			cm: func() *corev1.ConfigMap {
				cm := policyConfigMap("site-policy", broken)
				cm.Namespace = "elsewhere"
				return cm
			}(),
		},
		"the serving set stored again": {
			cm: policyConfigMap("zz-helpers", map[string]string{"helpers.rego": "package volumehealer\n\nhelper_reason := \"Helped\"\n"}),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := h.source.Check(h.ctx, tc.cm, tc.old)
			if len(tc.want) == 0 {
				if err != nil {
					t.Errorf("Check: %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrRejected) {
				t.Fatalf("Check: %v, want a rejection", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Check: %q, want it to hold %q", err, w)
				}
			}
		})
	}

	// Labelled ConfigMaps that hold no Rego at all: no_modules, as the controller says.
	only := fake.NewClientset()
	other, _ := newTestEngine(t, Options{})
	h2 := startConfigMapSource(t, only, nil, other)
	err := h2.source.Check(h2.ctx, policyConfigMap("notes", map[string]string{"notes.txt": "hello"}), nil)
	var le *LoadError
	if !errors.As(err, &le) || le.Kind != KindNoModules || !strings.HasPrefix(err.Error(), "ConfigMap volume-healer/notes: ") {
		t.Errorf("Check of a lone labelled ConfigMap without Rego: %v, want a no_modules rejection naming it", err)
	}

	if id := engine.Revision().ID(); id != serving {
		t.Errorf("serving %s after the checks, want %s: Check must not load", id, serving)
	}
	if v := loadErrors(t, reg); v != errorsBefore {
		t.Errorf("volume_healer_policy_load_errors_total = %v after checks only, want %v as before", v, errorsBefore)
	}
}

// TestCheckBeforeTheConfigMapsAreRead: a change cannot be judged without the rest of the set.
func TestCheckBeforeTheConfigMapsAreRead(t *testing.T) {
	engine, _ := newTestEngine(t, Options{})
	src, err := NewConfigMapSource(fake.NewClientset(), engine, ConfigMapOptions{Namespace: testNamespace})
	if err != nil {
		t.Fatal(err)
	}
	cm := policyConfigMap("site-policy", map[string]string{"policy.rego": skipPolicy("Good")})
	if err := src.Check(context.Background(), cm, nil); !errors.Is(err, ErrNotSynced) {
		t.Errorf("Check before Watch and Start: %v, want ErrNotSynced", err)
	}
}

// loadErrors sums volume_healer_policy_load_errors_total over its reasons.
func loadErrors(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	sum := 0.0
	for _, k := range errorKinds {
		sum += metricValue(t, reg, "volume_healer_policy_load_errors_total", map[string]string{"reason": string(k)})
	}
	return sum
}
