package config

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the key table in docs/configuration.md from the key table in keys.go")

const (
	docsPath   = "../docs/configuration.md"
	tableBegin = "<!-- BEGIN KEY TABLE: generated from config/keys.go by `go test ./config -run TestDocs -update` -->\n"
	tableEnd   = "<!-- END KEY TABLE -->\n"
)

// TestDocsKeyTable fails when the reference table in docs/configuration.md differs from the key
// table; run with -update to regenerate it.
func TestDocsKeyTable(t *testing.T) {
	raw, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	begin, end := strings.Index(doc, tableBegin), strings.Index(doc, tableEnd)
	if begin < 0 || end < begin {
		t.Fatalf("%s lacks the markers %q and %q", docsPath, tableBegin, tableEnd)
	}
	want := keyTable()
	got := doc[begin+len(tableBegin) : end]
	if got == want {
		return
	}
	if *update {
		doc = doc[:begin+len(tableBegin)] + want + doc[end:]
		if err := os.WriteFile(docsPath, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("the key table in %s is stale; run go test ./config -run TestDocs -update\n got:\n%s\nwant:\n%s", docsPath, got, want)
}

// TestDocsMentionsConfigFile checks the prose for the file's own flag and variable, which the
// generated table does not list.
func TestDocsMentionsConfigFile(t *testing.T) {
	raw, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--" + configFlag, configEnv, envPrefix} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("%s does not mention %s", docsPath, want)
		}
	}
}

// TestDocsExampleLoads loads the example file from the documentation, so that operators who copy
// it get a working configuration.
func TestDocsExampleLoads(t *testing.T) {
	raw, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	const fence = "```yaml\n"
	doc := string(raw)
	start := strings.Index(doc, fence)
	if start < 0 {
		t.Fatalf("%s has no yaml example", docsPath)
	}
	example := doc[start+len(fence):]
	example = example[:strings.Index(example, "```")]
	cfg, err := loadRaw(t, example, nil)
	if err != nil {
		t.Fatalf("the example in %s does not load: %v", docsPath, err)
	}
	if cfg.Schedule.StorageClasses["ceph-rbd"] == "" {
		t.Errorf("the example's StorageClass schedule was not read: %+v", cfg.Schedule)
	}
}

// keyTable renders the Markdown reference table of every key.
func keyTable() string {
	var b strings.Builder
	b.WriteString("| File key | Environment variable | Flag | Default | Meaning | Allowed values |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	defaults := Default()
	for _, s := range settings {
		fmt.Fprintf(&b, "| `%s` | `%s` | `--%s` | `%s` | %s | %s |\n",
			s.path, s.envName(), s.flagName(), displayDefault(s.field(&defaults)),
			markdownText(s.help), markdownText(s.allowed))
	}
	return b.String()
}

func displayDefault(field any) string {
	switch p := field.(type) {
	case *string:
		return strconv.Quote(*p)
	case *bool:
		return strconv.FormatBool(*p)
	case *int:
		return strconv.Itoa(*p)
	case *time.Duration:
		return formatDuration(*p)
	case *map[string]string:
		pairs := make([]string, 0, len(*p))
		for _, name := range sortedKeys(*p) {
			pairs = append(pairs, name+": "+strconv.Quote((*p)[name]))
		}
		return "{" + strings.Join(pairs, ", ") + "}"
	}
	panic(fmt.Sprintf("unsupported field type %T", field))
}

// markdownText keeps table cells intact and cron specs from turning into emphasis.
func markdownText(s string) string {
	return strings.NewReplacer("|", `\|`, "*", `\*`).Replace(s)
}
