package deploy

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

var update = flag.Bool("update", false, "rewrite the value tables of the charts' README.md from values.yaml")

const (
	valuesTableBegin = "<!-- BEGIN VALUES TABLE: generated from values.yaml by `go test ./test/deploy -run TestChartValuesDocumented -update` -->\n"
	valuesTableEnd   = "<!-- END VALUES TABLE -->\n"
)

// schemaNode is the part of a values.schema.json node the documentation check reads.
type schemaNode struct {
	Type                 any                    `json:"type"`
	Properties           map[string]*schemaNode `json:"properties"`
	AdditionalProperties any                    `json:"additionalProperties"`
	Enum                 []any                  `json:"enum"`
}

// closed tells whether the node is a set of values the chart defines: its keys are values of their
// own, each documented and in values.yaml. Other objects (resources, affinity, labels) are one
// value, passed to Kubernetes as they are.
func (s *schemaNode) closed() bool {
	return s.Properties != nil && s.AdditionalProperties == false
}

// valueDoc is one row of a chart's values table.
type valueDoc struct {
	key, typ, def, text string
}

// chartsWithSchema are the charts whose values are checked against their schema and documented in
// their README.md. configDocs names the values documented in docs/configuration.md instead of by a
// comment: the controller's configuration file, key by key.
var chartsWithSchema = []struct {
	dir        string
	configDocs string
}{
	{dir: "deploy/helm/volume-healer", configDocs: "config"},
	{dir: "deploy/helm/healer-refdriver"},
}

// TestChartValuesDocumented fails when a value of a chart's values.yaml has no comment above it
// (or, under config, no row in docs/configuration.md), when it is missing from values.schema.json
// or the schema names a value values.yaml lacks, and when the chart's README.md table differs from
// values.yaml; run with -update to regenerate the tables.
func TestChartValuesDocumented(t *testing.T) {
	configRows := configurationRows(t)
	for _, c := range chartsWithSchema {
		t.Run(c.dir, func(t *testing.T) {
			var doc yaml.Node
			raw, err := os.ReadFile(path(t, c.dir, "values.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			if err := yaml.Unmarshal(raw, &doc); err != nil {
				t.Fatalf("%s/values.yaml: %v", c.dir, err)
			}
			var schema schemaNode
			raw, err = os.ReadFile(path(t, c.dir, "values.schema.json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(raw, &schema); err != nil {
				t.Fatalf("%s/values.schema.json: %v", c.dir, err)
			}
			var rows []valueDoc
			// A value is documented by the comment above it, or by the comment above the group that
			// holds it (such as resources: with one key per container).
			var walk func(n *yaml.Node, s *schemaNode, prefix, groupText string)
			walk = func(n *yaml.Node, s *schemaNode, prefix, groupText string) {
				seen := map[string]bool{}
				for i := 0; i+1 < len(n.Content); i += 2 {
					k, v := n.Content[i], n.Content[i+1]
					key := prefix + k.Value
					seen[k.Value] = true
					sub, ok := s.Properties[k.Value]
					if !ok {
						t.Errorf("%s: value %s is not in values.schema.json", c.dir, key)
						continue
					}
					text := comment(k.HeadComment)
					if sub.closed() && v.Kind == yaml.MappingNode {
						walk(v, sub, key+".", text)
						continue
					}
					if text == "" {
						text = groupText
					}
					if c.configDocs != "" && strings.HasPrefix(key, c.configDocs+".") {
						if text == "" {
							text = configRows[strings.TrimPrefix(key, c.configDocs+".")]
						}
						if text == "" {
							t.Errorf("%s: value %s has no comment above it and no row in docs/configuration.md", c.dir, key)
						}
					} else if text == "" {
						t.Errorf("%s: value %s has no comment above it in values.yaml", c.dir, key)
					}
					rows = append(rows, valueDoc{key: key, typ: schemaType(sub), def: defaultOf(v), text: text})
				}
				for name := range s.Properties {
					if !seen[name] {
						t.Errorf("%s: values.schema.json names %s%s, which values.yaml lacks", c.dir, prefix, name)
					}
				}
			}
			walk(doc.Content[0], &schema, "", "")
			checkValuesTable(t, path(t, c.dir, "README.md"), valuesTable(rows))
		})
	}
}

// configurationRows reads the key table of docs/configuration.md: key to description.
func configurationRows(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(path(t, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		cells := strings.Split(line, " | ")
		if len(cells) < 6 || !strings.HasPrefix(cells[0], "| `") {
			continue
		}
		rows[strings.Trim(cells[0], "| `")] = cells[4] + " See docs/configuration.md."
	}
	return rows
}

// comment returns a head comment's text on one line, without the comment signs and helm-docs'
// "--" mark.
func comment(head string) string {
	var words []string
	for _, line := range strings.Split(head, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		line = strings.TrimSpace(strings.TrimPrefix(line, "--"))
		if line != "" {
			words = append(words, line)
		}
	}
	return strings.Join(words, " ")
}

// schemaType renders a schema node's type, with its enum when it has one.
func schemaType(s *schemaNode) string {
	var typ string
	switch v := s.Type.(type) {
	case string:
		typ = v
	case []any:
		var parts []string
		for _, p := range v {
			parts = append(parts, fmt.Sprint(p))
		}
		typ = strings.Join(parts, " or ")
	}
	if len(s.Enum) > 0 {
		var parts []string
		for _, e := range s.Enum {
			parts = append(parts, fmt.Sprint(e))
		}
		typ += " (" + strings.Join(parts, ", ") + ")"
	}
	return typ
}

// defaultOf renders a value's default for the table: JSON on one line, or a pointer to values.yaml
// for a text of several lines.
func defaultOf(v *yaml.Node) string {
	if v.Kind == yaml.ScalarNode && strings.Contains(v.Value, "\n") {
		return "(see values.yaml)"
	}
	var x any
	if err := v.Decode(&x); err != nil {
		return "(see values.yaml)"
	}
	b, err := json.Marshal(x)
	if err != nil {
		return "(see values.yaml)"
	}
	return "`" + string(b) + "`"
}

// valuesTable renders the rows as a Markdown table.
func valuesTable(rows []valueDoc) string {
	var b strings.Builder
	b.WriteString("| Value | Type | Default | Description |\n|---|---|---|---|\n")
	cell := strings.NewReplacer("|", `\|`, "\n", " ", "<", "&lt;")
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", r.key, cell.Replace(r.typ), cell.Replace(r.def), cell.Replace(r.text))
	}
	return b.String()
}

// checkValuesTable compares the table between the markers of readme with want, rewriting it with
// -update.
func checkValuesTable(t *testing.T, readme, want string) {
	t.Helper()
	raw, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	begin, end := strings.Index(doc, valuesTableBegin), strings.Index(doc, valuesTableEnd)
	if begin < 0 || end < begin {
		t.Fatalf("%s lacks the markers %q and %q", readme, valuesTableBegin, valuesTableEnd)
	}
	if doc[begin+len(valuesTableBegin):end] == want {
		return
	}
	if *update {
		doc = doc[:begin+len(valuesTableBegin)] + want + doc[end:]
		if err := os.WriteFile(readme, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("the values table of %s differs from values.yaml; run go test ./test/deploy -run TestChartValuesDocumented -update", readme)
}

// TestChartSchemaRefusesTypos checks that a misspelt or invalid value fails helm lint and helm
// template with the schema's message naming it, rather than being ignored.
func TestChartSchemaRefusesTypos(t *testing.T) {
	helm := tool(t, "helm")
	tests := []struct {
		chart string
		set   string
		want  *regexp.Regexp
	}{
		{chart, "config.budgets.perNod=3", regexp.MustCompile(`at '/config/budgets': additional properties 'perNod' not allowed`)},
		{chart, "image.pullPolicy=Sometimes", regexp.MustCompile(`at '/image/pullPolicy': value must be one of`)},
		{chart, "webhook.certificate.source=vault", regexp.MustCompile(`at '/webhook/certificate/source': value must be one of`)},
		{chart, "replicaCount=two", regexp.MustCompile(`at '/replicaCount': got string, want integer`)},
		{chart, "extraArg[0]=--dry-run", regexp.MustCompile(`additional properties 'extraArg' not allowed`)},
		{refdriverChart, "node.mode=hybrid", regexp.MustCompile(`at '/node/mode': value must be one of`)},
		{refdriverChart, "healerSidecar.tls.hostpath=/etc", regexp.MustCompile(`at '/healerSidecar/tls': additional properties 'hostpath' not allowed`)},
	}
	for _, tc := range tests {
		t.Run(tc.chart+" "+tc.set, func(t *testing.T) {
			for _, cmd := range [][]string{
				{"lint", tc.chart, "--set", tc.set},
				{"template", "rel", tc.chart, "--kube-version", kubeVersion, "--set", tc.set},
			} {
				_, err := runErr(repoRoot(t), helm, cmd...)
				if err == nil {
					t.Fatalf("helm %s succeeded", strings.Join(cmd, " "))
				}
				if !tc.want.MatchString(err.Error()) {
					t.Errorf("helm %s failed without the schema's message %q:\n%v", cmd[0], tc.want, err)
				}
			}
		})
	}
}

// TestChartExtras checks extraArgs, extraEnv, extraVolumes, extraVolumeMounts and
// topologySpreadConstraints of the controller's Deployment, and that by default they add nothing.
func TestChartExtras(t *testing.T) {
	var dep appsv1.Deployment
	convert(t, find(t, helmTemplate(t, "volume-healer", "volume-healer", nil), "Deployment", "volume-healer"), &dep)
	ctr := container(t, dep.Spec.Template.Spec, "controller")
	if !slices.Equal(ctr.Args, []string{"--config=/etc/volume-healer/config/config.yaml"}) {
		t.Errorf("default args %q, want only --config", ctr.Args)
	}
	if len(ctr.Env) != 0 {
		t.Errorf("the controller has env by default: %v", ctr.Env)
	}
	defaultMounts, defaultVolumes := len(ctr.VolumeMounts), len(dep.Spec.Template.Spec.Volumes)
	if tsc := dep.Spec.Template.Spec.TopologySpreadConstraints; len(tsc) != 0 {
		t.Errorf("topologySpreadConstraints by default: %v", tsc)
	}

	convert(t, find(t, helmTemplate(t, "volume-healer", "volume-healer", nil,
		"extraArgs[0]=--dry-run=true", "extraArgs[1]=--log-verbosity=4",
		"extraEnv[0].name=HTTPS_PROXY", "extraEnv[0].value=http://proxy:3128",
		"extraVolumes[0].name=extra-ca", "extraVolumes[0].configMap.name=corp-ca",
		"extraVolumeMounts[0].name=extra-ca", "extraVolumeMounts[0].mountPath=/etc/ssl/corp",
		"topologySpreadConstraints[0].maxSkew=1", "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
		"topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
	), "Deployment", "volume-healer"), &dep)
	spec := dep.Spec.Template.Spec
	ctr = container(t, spec, "controller")
	if want := []string{"--config=/etc/volume-healer/config/config.yaml", "--dry-run=true", "--log-verbosity=4"}; !slices.Equal(ctr.Args, want) {
		t.Errorf("args %q, want %q", ctr.Args, want)
	}
	if want := []corev1.EnvVar{{Name: "HTTPS_PROXY", Value: "http://proxy:3128"}}; !slices.Equal(ctr.Env, want) {
		t.Errorf("env %v, want %v", ctr.Env, want)
	}
	if got := mountPathOf(ctr, "extra-ca"); got != "/etc/ssl/corp" || len(ctr.VolumeMounts) != defaultMounts+1 {
		t.Errorf("extra-ca mounted at %q among %d mounts, want /etc/ssl/corp beside the %d of the chart", got, len(ctr.VolumeMounts), defaultMounts)
	}
	if v := volumeNamed(t, spec, "extra-ca"); v.ConfigMap == nil || v.ConfigMap.Name != "corp-ca" || len(spec.Volumes) != defaultVolumes+1 {
		t.Errorf("volume extra-ca %+v among %d volumes, want the ConfigMap corp-ca beside the %d of the chart", v, len(spec.Volumes), defaultVolumes)
	}
	if tsc := spec.TopologySpreadConstraints; len(tsc) != 1 || tsc[0].TopologyKey != "topology.kubernetes.io/zone" || tsc[0].WhenUnsatisfiable != corev1.ScheduleAnyway {
		t.Errorf("topologySpreadConstraints %+v, want the zone constraint", tsc)
	}

	// The reference driver's chart: each container its own.
	objs := refdriverTemplate(t, "rel", "ns",
		"node.extraArgs.refdriver[0]=--stat-timeout=9s", "node.extraEnv.healerSidecar[0].name=GODEBUG",
		"node.extraEnv.healerSidecar[0].value=x509sha1=0", "node.extraVolumes[0].name=scratch",
		"node.extraVolumes[0].emptyDir.medium=Memory", "node.extraVolumeMounts.refdriver[0].name=scratch",
		"node.extraVolumeMounts.refdriver[0].mountPath=/scratch",
		"controller.extraArgs.csiProvisioner[0]=--extra-create-metadata",
		"controller.topologySpreadConstraints[0].maxSkew=1", "controller.topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname",
		"controller.topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule")
	var ds appsv1.DaemonSet
	convert(t, find(t, objs, "DaemonSet", "rel-healer-refdriver-node"), &ds)
	driver := container(t, ds.Spec.Template.Spec, "refdriver")
	if last := driver.Args[len(driver.Args)-1]; last != "--stat-timeout=9s" {
		t.Errorf("the node driver's last argument is %q, want --stat-timeout=9s", last)
	}
	if mountPathOf(driver, "scratch") != "/scratch" || volumeNamed(t, ds.Spec.Template.Spec, "scratch").EmptyDir == nil {
		t.Errorf("the node driver lacks the scratch emptyDir at /scratch: %v", driver.VolumeMounts)
	}
	if mountPathOf(container(t, ds.Spec.Template.Spec, "healer-sidecar"), "scratch") != "" {
		t.Error("a mount given to the driver reached the healer sidecar")
	}
	sidecarEnv := container(t, ds.Spec.Template.Spec, "healer-sidecar").Env
	if !slices.Contains(sidecarEnv, corev1.EnvVar{Name: "GODEBUG", Value: "x509sha1=0"}) {
		t.Errorf("the healer sidecar's env %v lacks GODEBUG", sidecarEnv)
	}
	if slices.ContainsFunc(driver.Env, func(e corev1.EnvVar) bool { return e.Name == "GODEBUG" }) {
		t.Error("the healer sidecar's env reached the driver")
	}
	convert(t, find(t, objs, "Deployment", "rel-healer-refdriver-controller"), &dep)
	prov := container(t, dep.Spec.Template.Spec, "csi-provisioner")
	if last := prov.Args[len(prov.Args)-1]; last != "--extra-create-metadata" {
		t.Errorf("external-provisioner's last argument is %q, want --extra-create-metadata", last)
	}
	if tsc := dep.Spec.Template.Spec.TopologySpreadConstraints; len(tsc) != 1 || tsc[0].TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("the controller plugin's topologySpreadConstraints %+v, want the hostname constraint", tsc)
	}
}

// TestChartFullnameOverride checks that fullnameOverride renames every object the chart names
// after the release, and nameOverride the app.kubernetes.io/name label and the selector.
func TestChartFullnameOverride(t *testing.T) {
	plain := helmTemplate(t, "rel", "ns", nil)
	renamed := helmTemplate(t, "rel", "ns", nil, "fullnameOverride=healer", "nameOverride=healer-app")
	if len(plain) != len(renamed) {
		t.Fatalf("%d objects with fullnameOverride, %d without", len(renamed), len(plain))
	}
	for i, o := range plain {
		r := renamed[i]
		if want := strings.Replace(o.GetName(), "rel-volume-healer", "healer", 1); r.GetName() != want {
			t.Errorf("%s %s is named %s with fullnameOverride=healer, want %s", o.GetKind(), o.GetName(), r.GetName(), want)
		}
		if l, ok := r.GetLabels()["app.kubernetes.io/name"]; ok && l != "healer-app" {
			t.Errorf("%s %s has app.kubernetes.io/name %q, want healer-app", r.GetKind(), r.GetName(), l)
		}
	}
	var dep appsv1.Deployment
	convert(t, find(t, renamed, "Deployment", "healer"), &dep)
	if got := dep.Spec.Selector.MatchLabels["app.kubernetes.io/name"]; got != "healer-app" {
		t.Errorf("the Deployment selects app.kubernetes.io/name %q, want healer-app", got)
	}

	rd := refdriverTemplate(t, "rel", "ns", "fullnameOverride=fuse")
	find(t, rd, "DaemonSet", "fuse-node")
	find(t, rd, "Deployment", "fuse-controller")
}
