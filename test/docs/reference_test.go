package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/volume-healer/volume-healer/admission/propagation"
	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/policy/webhook"
	"github.com/volume-healer/volume-healer/scheduler/dispatch"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/test/metricstest"
	"github.com/volume-healer/volume-healer/version"
	"github.com/volume-healer/volume-healer/version/versionmetrics"
)

// referenceDoc is the reference table, relative to the module's root.
const referenceDoc = "docs/reference.md"

// The sections of docs/reference.md, each a table whose rows start with a name in a code span.
const (
	sectionEvents      = "Event reasons"
	sectionAnnotations = "Annotation and label keys"
	sectionMetrics     = "Metrics"
)

// productFiles returns the Go files that ship (outside test/ and hack/, tests excluded), parsed,
// by folder relative to root.
func productFiles(t *testing.T, root string) map[string][]*ast.File {
	t.Helper()
	fset := token.NewFileSet()
	out := map[string][]*ast.File{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == "test" || rel == "hack" || strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" || d.Name() == "bin" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(filepath.Dir(rel))
		out[dir] = append(out[dir], f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// stringConsts returns the constants of files whose value is a string literal, by name.
func stringConsts(files []*ast.File) map[string]string {
	out := map[string]string{}
	for _, f := range files {
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					if v, err := strconv.Unquote(lit.Value); err == nil {
						out[name.Name] = v
					}
				}
			}
		}
	}
	return out
}

// usesEventRecorder says whether a package records Events: one of its files names an
// EventRecorder type (client-go's record or events package).
func usesEventRecorder(files []*ast.File) bool {
	found := false
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "EventRecorder" {
				found = true
			}
			return !found
		})
	}
	return found
}

// eventReasons returns the Event reasons the product records: the string constants named
// Reason... of every package that records Events, with the package that defines each.
func eventReasons(t *testing.T, files map[string][]*ast.File) map[string]string {
	t.Helper()
	out := map[string]string{}
	for dir, fs := range files {
		if !usesEventRecorder(fs) {
			continue
		}
		for name, v := range stringConsts(fs) {
			if strings.HasPrefix(name, "Reason") {
				out[v] = dir
			}
		}
	}
	if len(out) < 20 {
		t.Fatalf("only %d Event reasons found in the packages that record Events: %v", len(out), out)
	}
	return out
}

// annotationKey matches a key with a domain prefix, as the annotation and label keys are; the
// values of api/annotations (off, rego, HostToContainer) have none.
var annotationKey = regexp.MustCompile(`^[a-z0-9.-]+/[A-Za-z0-9._-]+$`)

// annotationKeys returns the annotation and label keys of api/annotations, the contract's one file.
func annotationKeys(t *testing.T, files map[string][]*ast.File) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, v := range stringConsts(files["api/annotations"]) {
		if annotationKey.MatchString(v) {
			out[v] = name
		}
	}
	if len(out) < 10 {
		t.Fatalf("only %d keys found in api/annotations: %v", len(out), out)
	}
	return out
}

// metricLiteral matches a string literal that is a metric name of the project.
var metricLiteral = regexp.MustCompile(`^volume_healer_[a-z0-9_]+$`)

// metricNames returns the metrics the controller and the sidecar expose, from their registries
// with every vector given a child, and every metric name spelt out in the product's code, so that
// a metric registered by a package no registry here builds is found too.
func metricNames(t *testing.T, files map[string][]*ast.File) map[string]string {
	t.Helper()
	out := map[string]string{}
	for binary, build := range map[string]func(prometheus.Registerer) error{
		"controller": func(reg prometheus.Registerer) error {
			healer.NewMetrics(reg)
			evict.NewMetrics(reg)
			trigger.NewMetrics(reg)
			dispatch.NewMetrics(reg)
			policy.NewMetrics(reg)
			webhook.NewMetrics(reg)
			propagation.NewMetrics(reg)
			return reg.Register(versionmetrics.NewBuildInfo(version.Get()))
		},
		"sidecar": func(reg prometheus.Registerer) error { sidecar.NewMetrics(reg); return nil },
	} {
		r := metricstest.NewRecorder()
		if err := build(r); err != nil {
			t.Fatal(err)
		}
		r.Touch(t)
		mfs, err := r.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			out[mf.GetName()] = binary + " " + strings.ToLower(dto.MetricType_name[int32(mf.GetType())])
		}
	}
	for dir, fs := range files {
		for _, f := range fs {
			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				if v, err := strconv.Unquote(lit.Value); err == nil && metricLiteral.MatchString(v) {
					if _, known := out[v]; !known {
						// Computed at scrape time (the Sweeper's gauges): its type is not known here.
						binary := "controller"
						if dir == "sidecar" || strings.HasPrefix(dir, "sidecar/") {
							binary = "sidecar"
						}
						out[v] = binary + " ?"
					}
				}
				return true
			})
		}
	}
	if len(out) < 40 {
		t.Fatalf("only %d metrics found: %v", len(out), out)
	}
	return out
}

// tableCode matches a table row and the code span of its first cell.
var tableCode = regexp.MustCompile("^\\|\\s*`([^`]+)`")

// referenceRows returns, for each "## " section of doc, the names in the first cells of its table
// rows, with the row's cells.
func referenceRows(doc string) map[string]map[string][]string {
	out := map[string]map[string][]string{}
	section := ""
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "## ") {
			section = strings.TrimSpace(strings.TrimPrefix(line, "## "))
			continue
		}
		m := tableCode.FindStringSubmatch(line)
		if m == nil || section == "" {
			continue
		}
		if out[section] == nil {
			out[section] = map[string][]string{}
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		out[section][m[1]] = cells
	}
	return out
}

// compareNames reports the names the code has and the section lacks, and those the section lists
// and the code does not have.
func compareNames(t *testing.T, section string, code map[string]string, listed map[string][]string) {
	t.Helper()
	var missing, extra []string
	for name, where := range code {
		if _, ok := listed[name]; !ok {
			missing = append(missing, name+" ("+where+")")
		}
	}
	for name := range listed {
		if _, ok := code[name]; !ok {
			extra = append(extra, name)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	for _, m := range missing {
		t.Errorf("%s, %q: %s is missing; add a row for it", referenceDoc, section, m)
	}
	for _, e := range extra {
		t.Errorf("%s, %q: %s is listed, but the code has no such name: remove or rename its row", referenceDoc, section, e)
	}
}

// TestReferenceTable checks that docs/reference.md lists every Event reason the product records,
// every annotation and label key of api/annotations and every metric the controller and the
// sidecar expose, and nothing else, so that the table cannot drift from the code: a new reason,
// key or metric fails here until it has its row, and a removed one until its row goes.
func TestReferenceTable(t *testing.T) {
	root := repoRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, referenceDoc))
	if err != nil {
		t.Fatal(err)
	}
	rows := referenceRows(string(doc))
	files := productFiles(t, root)

	compareNames(t, sectionEvents, eventReasons(t, files), rows[sectionEvents])
	keys := annotationKeys(t, files)
	compareNames(t, sectionAnnotations, keys, rows[sectionAnnotations])
	metrics := metricNames(t, files)
	compareNames(t, sectionMetrics, metrics, rows[sectionMetrics])

	// What the rows say besides the name, where the code says it too.
	for key, cells := range rows[sectionAnnotations] {
		prev := annotations.Previous(key)
		switch {
		case len(cells) < 2:
			t.Errorf("%s: the row of %s has no second cell", referenceDoc, key)
		case prev == "" && cells[1] != "–":
			t.Errorf("%s: %s had no other key in 0.1.0, but its row says %s: write –", referenceDoc, key, cells[1])
		case prev != "" && cells[1] != "`"+prev+"`":
			t.Errorf("%s: %s was %s in 0.1.0 (read still), but its row says %s", referenceDoc, key, prev, cells[1])
		}
	}
	for name, cells := range rows[sectionMetrics] {
		what, ok := metrics[name]
		if !ok || len(cells) < 3 {
			continue
		}
		binary, typ, _ := strings.Cut(what, " ")
		if name == "volume_healer_build_info" {
			binary = "both"
		}
		if typ == "?" {
			typ = cells[2]
		}
		if cells[1] != binary || cells[2] != typ {
			t.Errorf("%s: %s is a %s of the %s, but its row says %s of the %s", referenceDoc, name, typ, binary, cells[2], cells[1])
		}
	}
}

// TestReferenceRows checks how rows are read, so that TestReferenceTable cannot pass by reading
// none.
func TestReferenceRows(t *testing.T) {
	doc := "# Reference\n\n## Event reasons\n\n| reason | type |\n|---|---|\n| `VolumeHealed` | Normal |\n\n" +
		"## Metrics\n\n| metric | binary | type |\n|---|---|---|\n| `volume_healer_leader` | controller | gauge |\nnot a row `x`\n"
	rows := referenceRows(doc)
	if _, ok := rows[sectionEvents]["VolumeHealed"]; !ok || len(rows[sectionEvents]) != 1 {
		t.Errorf("events: %v", rows[sectionEvents])
	}
	if cells := rows[sectionMetrics]["volume_healer_leader"]; len(rows[sectionMetrics]) != 1 || len(cells) != 3 || cells[2] != "gauge" {
		t.Errorf("metrics: %v", rows[sectionMetrics])
	}
}
