package deploy

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// dashboard is the part of a Grafana dashboard the test looks at.
type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		GridPos struct {
			H, W, X, Y int
		} `json:"gridPos"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// TestDashboard checks that the dashboard loads, draws every panel from the chosen data source,
// queries only metrics that exist with queries that parse, and covers what operators look at:
// sweeps, the leader, each StorageClass's time since its last scheduled sweep against its
// schedule, decisions, heals and failures per driver, budget saturation and the policy's status.
func TestDashboard(t *testing.T) {
	var d dashboard
	if err := json.Unmarshal(mustRead(t, path(t, "deploy", "grafana", "volume-healer.json")), &d); err != nil {
		t.Fatalf("deploy/grafana/volume-healer.json: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Error("the dashboard needs a uid and a title, so that an import replaces the previous version")
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" {
		t.Error("the dashboard has no data source variable named datasource")
	}

	ids := map[int]bool{}
	var exprs []string
	all := ""
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d is used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q does not fit the 24-column grid: %+v", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q does not use the datasource variable", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
			all += tg.Expr + "\n"
			for _, ref := range variableRefs(tg.Expr) {
				if _, ok := vars[ref]; !ok && !strings.HasPrefix(ref, "__") {
					t.Errorf("panel %q uses the undefined variable $%s", p.Title, ref)
				}
			}
		}
	}
	if unknown := unknownMetrics(t, exprs); len(unknown) > 0 {
		t.Errorf("the dashboard queries metrics that nothing exposes: %v", unknown)
	}
	queried := map[string]bool{}
	for _, name := range metricName.FindAllString(all, -1) {
		queried[name] = true
	}
	for topic, metric := range map[string]string{
		"sweeps":                                "volume_healer_sweeps_finished_total",
		"sweep duration":                        "volume_healer_sweep_duration_seconds_bucket",
		"decisions":                             "volume_healer_sweep_decisions_total",
		"which replica leads":                   "volume_healer_leader",
		"time since each class's sweep":         "volume_healer_scheduled_sweep_last_finished_timestamp_seconds",
		"the time each class's schedule allows": "volume_healer_schedule_interval_seconds",
		"probes per driver":                     "volume_healer_probes_total",
		"heals and failures per driver":         "volume_healer_heals_total",
		"claims failing to heal":                "volume_healer_volume_heal_failing",
		"claims whose pods see a dead mount":    "volume_healer_pods_on_dead_mount_since_timestamp_seconds",
		"pod evictions":                         "volume_healer_evictions_total",
		"unhealthy volumes":                     "volume_healer_volumes_unhealthy",
		"failed sidecar calls":                  "volume_healer_call_errors_total",
		"calls in flight":                       "volume_healer_dispatch_in_flight",
		"budgets, for saturation":               "volume_healer_dispatch_budget",
		"time waited for a budget":              "volume_healer_dispatch_budget_wait_seconds_bucket",
		"policy revision":                       "volume_healer_policy_revision_info",
		"policy rejections":                     "volume_healer_policy_load_errors_total",
		"newest policy rejected":                "volume_healer_policy_rejected",
		"sidecar calls":                         "volume_healer_sidecar_calls_total",
	} {
		if !queried[metric] {
			t.Errorf("no panel shows %s (%s)", topic, metric)
		}
	}
	checkQueries(t, exprs)
}

// checkQueries has promtool parse every query of the dashboard, as recording rules, with
// Grafana's interval variable replaced by a duration: a query that does not parse shows an
// error in its panel instead of data.
func checkQueries(t *testing.T, exprs []string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs {
		e = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h").Replace(e)
		fmt.Fprintf(&b, "      - record: dashboard:query%d\n        expr: %s\n", i, strconv.Quote(e))
	}
	file := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	writeFile(t, file, b.String())
	if out, err := runErr(filepath.Dir(file), tool(t, "promtool"), "check", "rules", file); err != nil {
		t.Errorf("promtool does not accept the dashboard's queries: %v\n%s", err, out)
	}
}

// variableRefs returns the names of the $variables in a query.
func variableRefs(expr string) []string {
	var out []string
	for i := 0; i < len(expr); i++ {
		if expr[i] != '$' {
			continue
		}
		j := i + 1
		for j < len(expr) && (expr[j] == '_' || expr[j] >= 'a' && expr[j] <= 'z' || expr[j] >= 'A' && expr[j] <= 'Z' || expr[j] >= '0' && expr[j] <= '9') {
			j++
		}
		if j > i+1 {
			out = append(out, expr[i+1:j])
		}
		i = j - 1
	}
	return out
}
