package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// repoRoot returns the module's root: go test runs in the package's folder, two below it.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod two folders up from the test: %v", err)
	}
	return root
}

// markdownFiles returns the Markdown files git tracks, and those not yet added, relative to root.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.md")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	var files []string
	for _, f := range strings.Fields(string(out)) {
		if _, err := os.Stat(filepath.Join(root, f)); err == nil {
			files = append(files, f)
		}
	}
	if len(files) == 0 {
		t.Fatal("no Markdown file found")
	}
	return files
}

// markdownLink matches an inline link or image, [text](target) or [text](target "title"); the text
// may hold code spans and one level of brackets.
var markdownLink = regexp.MustCompile(`\]\(\s*<?([^()\s<>]+)>?(?:\s+"[^"]*")?\s*\)`)

// link is one relative link of a Markdown file.
type link struct {
	line   int
	target string
}

// relativeLinks returns the links of a Markdown document that point into the repository, outside
// fenced code blocks and code spans.
func relativeLinks(doc []byte) []link {
	var out []link
	fenced := false
	sc := bufio.NewScanner(bytes.NewReader(doc))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if trimmed := strings.TrimSpace(line); strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range markdownLink.FindAllStringSubmatch(withoutCodeSpans(line), -1) {
			target := m[1]
			if u, err := url.Parse(target); err == nil && u.Scheme != "" {
				continue // http, https, mailto: not the repository's
			}
			out = append(out, link{line: n, target: target})
		}
	}
	return out
}

// codeSpan matches an inline code span of one or two backticks.
var codeSpan = regexp.MustCompile("``[^`]*``|`[^`]*`")

// withoutCodeSpans blanks the code spans of a line, keeping its length, so that a link's
// syntax shown as code is not taken for a link; a link whose text is code keeps its target.
func withoutCodeSpans(line string) string {
	return codeSpan.ReplaceAllStringFunc(line, func(s string) string { return strings.Repeat("x", len(s)) })
}

// headingAnchors returns the anchors GitHub gives the headings of a Markdown document: the
// heading's text in lower case, without punctuation, spaces turned into hyphens, and "-1", "-2"
// appended to repeats; plus the anchors of explicit <a name="..."> and id="..." attributes.
func headingAnchors(doc []byte) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(string(doc), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range explicitAnchor.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		if !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimLeft(line, "#")
		if text == "" || text[0] != ' ' {
			continue
		}
		slug := slugify(strings.TrimSpace(text))
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

// explicitAnchor matches an HTML anchor or id in a Markdown document.
var explicitAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)

// slugify is GitHub's anchor of a heading's text.
func slugify(text string) string {
	// Links in a heading count by their text.
	text = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(text, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestMarkdownLinks checks every relative link of the project's Markdown files: the file or
// folder it names exists, and the heading its #fragment names is one of that Markdown file's.
// A page moved or a heading renamed fails here, with the file and line of each link it broke.
func TestMarkdownLinks(t *testing.T) {
	root := repoRoot(t)
	anchorsOf := map[string]map[string]bool{}
	anchors := func(path string) (map[string]bool, error) {
		if a, ok := anchorsOf[path]; ok {
			return a, nil
		}
		doc, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		anchorsOf[path] = headingAnchors(doc)
		return anchorsOf[path], nil
	}
	checked := 0
	for _, file := range markdownFiles(t, root) {
		doc, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range relativeLinks(doc) {
			checked++
			path, fragment, _ := strings.Cut(l.target, "#")
			target := filepath.Join(root, file)
			if path != "" {
				unescaped, err := url.PathUnescape(path)
				if err != nil {
					t.Errorf("%s:%d: link %q: %v", file, l.line, l.target, err)
					continue
				}
				target = filepath.Join(filepath.Dir(target), filepath.FromSlash(unescaped))
				if rel, err := filepath.Rel(root, target); err != nil || strings.HasPrefix(rel, "..") {
					t.Errorf("%s:%d: link %q leaves the repository", file, l.line, l.target)
					continue
				}
			}
			info, err := os.Stat(target)
			if err != nil {
				t.Errorf("%s:%d: link %q: no such file or folder", file, l.line, l.target)
				continue
			}
			if fragment == "" {
				continue
			}
			if info.IsDir() || !strings.HasSuffix(target, ".md") {
				// GitHub's line anchors (#L10) and anchors of rendered code are not checked.
				continue
			}
			a, err := anchors(target)
			if err != nil {
				t.Fatal(err)
			}
			if !a[strings.ToLower(fragment)] {
				t.Errorf("%s:%d: link %q: %s has no heading with the anchor #%s", file, l.line, l.target, filepath.Base(target), fragment)
			}
		}
	}
	if checked < 100 {
		t.Errorf("only %d relative links checked: is the link pattern still right?", checked)
	}
}

// TestSlugify pins the anchors of headings as GitHub makes them, which the links of the
// documentation rely on.
func TestSlugify(t *testing.T) {
	tests := map[string]string{
		"Install from this repository, step by step":     "install-from-this-repository-step-by-step",
		"healerctl's cluster flags, and completion":      "healerctls-cluster-flags-and-completion",
		"2.2 What you import and what stays stable":      "22-what-you-import-and-what-stays-stable",
		"Plugin restart to workload I/O resumed":         "plugin-restart-to-workload-io-resumed",
		"From 0.1.0: the keys move to volume-healer.io":  "from-010-the-keys-move-to-volume-healerio",
		"The `healer` tier":                              "the-healer-tier",
		"Sidecar memory and the cluster's size":          "sidecar-memory-and-the-clusters-size",
		"[VolumeHealFailed](alerts.md#volumehealfailed)": "volumehealfailed",
		"snake_case names":                               "snake_case-names",
	}
	for heading, want := range tests {
		if got := slugify(heading); got != want {
			t.Errorf("slugify(%q) = %q, want %q", heading, got, want)
		}
	}
}

// TestRelativeLinks checks what counts as a link to check, so that TestMarkdownLinks cannot pass
// by finding none.
func TestRelativeLinks(t *testing.T) {
	doc := []byte("See [operations](docs/operations.md#install-with-helm) and [the site](https://example.com).\n" +
		"`[not a link](nowhere.md)` and [`code` text](docs/alerts.md).\n" +
		"```\n[in a block](nowhere.md)\n```\n" +
		"![image](img.png \"title\")\n")
	var got []string
	for _, l := range relativeLinks(doc) {
		got = append(got, fmt.Sprintf("%d:%s", l.line, l.target))
	}
	want := []string{"1:docs/operations.md#install-with-helm", "2:docs/alerts.md", "6:img.png"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("relativeLinks = %v, want %v", got, want)
	}
}
