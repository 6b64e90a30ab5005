// Package docs checks that the documentation says what the code does: every relative link of the
// project's Markdown files leads to a file and a heading that exist, and docs/reference.md lists
// every Event reason, annotation and label key and metric the project emits, and nothing else.
//
// It owns these checks and nothing else: it has no code outside its tests. It reads the
// repository's Markdown and Go source, and of the product only the names an operator reads (the
// metrics its packages register, the annotation keys); it must not import cmd/: the programs are
// what the documentation describes, not what it tests. Nothing imports it.
package docs
