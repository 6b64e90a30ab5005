package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// rulesFile is the plain Prometheus rules file, relative to the module's root.
const rulesFile = "deploy/prometheus/rules.yaml"

// ruleGroups is the part of a rules file the tests look at.
type ruleGroups struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readRules(t *testing.T, data []byte) ruleGroups {
	t.Helper()
	var g ruleGroups
	if err := yaml.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Groups) == 0 {
		t.Fatal("no rule groups")
	}
	return g
}

// generic decodes YAML into maps and slices, for comparing documents regardless of layout.
func generic(t *testing.T, data []byte) any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// requiredAlerts are the alerts the project promises operators (docs/alerts.md).
var requiredAlerts = []string{
	"VolumeHealFailed",
	"VolumePodsOnDeadMount",
	"VolumeRecycleStuck",
	"VolumeHealFailureRatioHigh",
	"VolumeDataLoss",
	"VolumeHealerSidecarUnreachable",
	"VolumeHealerSidecarDown",
	"VolumeHealerPolicyRejected",
	"VolumeHealerScheduledSweepOverdue",
	"VolumeHealerControllerDown",
}

// TestRulesPromtool checks the rules file with promtool and runs its unit tests.
func TestRulesPromtool(t *testing.T) {
	promtool := tool(t, "promtool")
	root := repoRoot(t)
	out := run(t, root, promtool, "check", "rules", rulesFile)
	if !bytes.Contains(out, []byte("SUCCESS")) {
		t.Errorf("promtool check rules: %s", out)
	}
	tests, err := filepath.Glob(filepath.Join(root, "deploy", "prometheus", "tests", "*.yaml"))
	if err != nil || len(tests) == 0 {
		t.Fatalf("no rule tests in deploy/prometheus/tests (%v)", err)
	}
	out = run(t, root, promtool, append([]string{"test", "rules"}, tests...)...)
	if bytes.Contains(out, []byte("FAILED")) {
		t.Errorf("promtool test rules: %s", out)
	}
	// Every alert has a unit test that shows it firing.
	var all []byte
	for _, f := range tests {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, data...)
	}
	for _, a := range requiredAlerts {
		if !regexp.MustCompile(`alertname: ` + a + `\n\s+exp_alerts:\n\s+- exp_labels`).Match(all) {
			t.Errorf("no unit test in deploy/prometheus/tests shows %s firing", a)
		}
	}
}

// TestRulesContent checks what an operator reads when an alert fires: every promised alert exists,
// has a severity, a summary, a description and a runbook section that exists in docs/alerts.md,
// and selects only metrics that the code exposes.
func TestRulesContent(t *testing.T) {
	data, err := os.ReadFile(path(t, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	runbooks, err := os.ReadFile(path(t, "docs", "alerts.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## (\S+)`).FindAllSubmatch(runbooks, -1) {
		anchors[strings.ToLower(string(m[1]))] = true
	}
	have := map[string]bool{}
	var exprs []string
	for _, g := range readRules(t, data).Groups {
		for _, r := range g.Rules {
			have[r.Alert] = true
			exprs = append(exprs, r.Expr)
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", r.Alert, s)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s has no %s", r.Alert, a)
				}
			}
			url := r.Annotations["runbook_url"]
			want := "https://github.com/volume-healer/volume-healer/blob/main/docs/alerts.md#" + strings.ToLower(r.Alert)
			if url != want {
				t.Errorf("%s: runbook_url %s, want %s", r.Alert, url, want)
			}
			if !anchors[strings.ToLower(r.Alert)] {
				t.Errorf("%s: docs/alerts.md has no section \"## %s\"", r.Alert, r.Alert)
			}
		}
	}
	for _, a := range requiredAlerts {
		if !have[a] {
			t.Errorf("alert %s is missing from %s", a, rulesFile)
		}
	}
	if unknown := unknownMetrics(t, exprs); len(unknown) > 0 {
		t.Errorf("the rules select metrics that nothing exposes: %v", unknown)
	}
}

// TestRulesCopiesAgree keeps the PrometheusRule, the Helm chart and the plain rules file the same.
func TestRulesCopiesAgree(t *testing.T) {
	plain, err := os.ReadFile(path(t, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	want := generic(t, plain).(map[string]any)["groups"]

	pr := decode(t, mustRead(t, path(t, "deploy", "prometheus", "prometheusrule.yaml")))
	if len(pr) != 1 || pr[0].GetKind() != "PrometheusRule" {
		t.Fatalf("deploy/prometheus/prometheusrule.yaml holds %d objects, want one PrometheusRule", len(pr))
	}
	if got := pr[0].Object["spec"].(map[string]any)["groups"]; !sameYAML(t, got, want) {
		t.Error("deploy/prometheus/prometheusrule.yaml differs from rules.yaml")
	}

	for file, copyOf := range map[string]string{
		"deploy/helm/volume-healer/files/rules.yaml":         rulesFile,
		"deploy/helm/volume-healer/files/volume-healer.json": "deploy/grafana/volume-healer.json",
	} {
		if !bytes.Equal(mustRead(t, path(t, file)), mustRead(t, path(t, copyOf))) {
			t.Errorf("%s differs from %s: copy it again", file, copyOf)
		}
	}

	objs := helmTemplate(t, "volume-healer", "volume-healer", nil)
	got := find(t, objs, "PrometheusRule", "volume-healer").Object["spec"].(map[string]any)["groups"]
	if !sameYAML(t, got, want) {
		t.Error("the Helm chart's PrometheusRule, with the default values, differs from rules.yaml")
	}
}

// TestRulesHelmValues checks that the chart's alert settings reach the expressions and still give
// valid rules.
func TestRulesHelmValues(t *testing.T) {
	objs := helmTemplate(t, "volume-healer", "storage", nil,
		"prometheusRule.controllerJob=healer",
		"prometheusRule.sidecarJob=csi/.*-sidecar",
		"prometheusRule.healFailureRatio=0.25",
		"prometheusRule.healFailureMinHeals=20",
		"prometheusRule.podsOnDeadMountSeconds=600",
		"prometheusRule.runbookBaseURL=https://runbooks.example.com/volume-healer",
	)
	pr := find(t, objs, "PrometheusRule", "volume-healer")
	spec, err := yaml.Marshal(pr.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, spec, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, repoRoot(t), tool(t, "promtool"), "check", "rules", file)

	rules := map[string]string{}
	for _, g := range readRules(t, spec).Groups {
		for _, r := range g.Rules {
			rules[r.Alert] = r.Expr + "\n" + strings.Join(mapValues(r.Annotations), "\n")
		}
	}
	for alert, wants := range map[string][]string{
		"VolumeHealerControllerDown":        {`up{job="healer"}`, "(job healer)", "https://runbooks.example.com/volume-healer#volumehealercontrollerdown"},
		"VolumeHealerScheduledSweepOverdue": {`process_start_time_seconds{job="healer"}`, `volume_healer_leader{job="healer"}`, `volume_healer_schedule_interval_seconds{job="healer"}`},
		"VolumeHealerSidecarDown":           {`up{job=~"csi/.*-sidecar"}`},
		"VolumeHealFailureRatioHigh":        {") > 0.25\n", ">= 20\n"},
		"VolumePodsOnDeadMount":             {"(volume_healer_pods_on_dead_mount_since_timestamp_seconds) > 600\n"},
	} {
		for _, w := range wants {
			if !strings.Contains(rules[alert], w) {
				t.Errorf("%s lacks %q with the values set:\n%s", alert, w, rules[alert])
			}
		}
	}
	for alert, text := range rules {
		for _, stale := range []string{`job="volume-healer"`, "docs/alerts.md"} {
			if strings.Contains(text, stale) {
				t.Errorf("%s still holds the default %q", alert, stale)
			}
		}
	}
}

func mapValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func mustRead(t *testing.T, file string) []byte {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// sameYAML compares two decoded documents after a round trip through YAML, which evens out the
// types different decoders give (int and int64, say).
func sameYAML(t *testing.T, a, b any) bool {
	t.Helper()
	norm := func(v any) any {
		data, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return generic(t, data)
	}
	return reflect.DeepEqual(norm(a), norm(b))
}
